# One H200: a thread graph that rarely replays is dropped (thread_graphs.REPLAY_WINDOW): the hook's
# GPU tests, then a same-machine A/B against the tree before it (out/old: `git archive 7eee453`)
# on the plain, DLRM and candidates scripts (thread graphs that do replay: nothing may change) and
# optional features (whose thread graphs served 15-22 of 12,000 calls).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
CASES="plain4 dlrm4 cand4 opt2" timeout 420 bash bench/apply/hook_ab.sh out/old 2 > $OUT/hook_ab.txt 2>&1
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/hook_ab.jsonl"):
    r = json.loads(l); h = r.get("hook") or {}
    print(r["label"], r["script"], r.get("qps"), r.get("p99_ms"), r.get("checksum"), "tr", h.get("thread_replays"),
          "tg", h.get("thread_graphs"), "staged", h.get("staged_copies"), "fb", [k[:40] for k in h.get("fallbacks") or []])
PY
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
