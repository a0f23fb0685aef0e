# One H200: the thread-graph drop (thread_graphs.REPLAY_WINDOW) measured on one tree, as the A/B
# across trees of the twenty-first session drifted more than the effect (results/session21_h200/):
# each case with the default and with RECSYS_DOCTOR_REPLAY_WINDOW=0 (never dropped, as before),
# rounds alternating in order; optional features unhooked beside them; and the hook's GPU tests
# (session22_second.sh: the held-out scripts through profile --apply).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
# (opt0, unhooked, under both settings: how far the machine drifts between two runs of one case)
CASES="opt0 opt2 cand4 dlrm4" KNOBS="- RECSYS_DOCTOR_REPLAY_WINDOW=0" timeout 330 bash bench/apply/knob_ab.sh 2 > $OUT/knob_ab.txt 2>&1
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/knob_ab.jsonl"):
    r = json.loads(l); h = r.get("hook") or {}
    print(r["label"], r["script"], r.get("groups"), r.get("qps"), r.get("p99_ms"), r.get("checksum"), "tr", h.get("thread_replays"),
          "staged", h.get("staged_copies"), "fb", len(h.get("fallbacks") or []))
PY
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
