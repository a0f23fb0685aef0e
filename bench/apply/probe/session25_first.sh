# One H200, session 25: the hook's steady path made cheaper (a thread graph's ReadMark instead of an
# event query before a query's slot writes, the slot event recorded on the group's stream object,
# the usual call's arguments checked flat, the gate's readers on a plain lock, steady copies
# counted per calling line in one step). A same-machine A/B against the tree before it (out/old:
# `git archive ce2a778`, carried in .whl/) on the DLRM, MMoE and plain scripts under fixed plans,
# then the hook's GPU tests on the new tree.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p out/old && tar xzf .whl/old_ce2a778.tar.gz -C out/old
CASES="${CASES:-dlrm4 mmoe8 plain4}" timeout ${AB_T:-380} bash bench/apply/hook_ab.sh out/old ${ROUNDS:-2} > $OUT/hook_ab.txt 2>&1
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/hook_ab.jsonl"):
    r = json.loads(l); h = r.get("hook") or {}
    print(r["label"], r["script"], r.get("qps"), r.get("p99_ms"), r.get("checksum"), "tr", h.get("thread_replays"),
          "tg", h.get("thread_graphs"), "fb", [k[:50] for k in h.get("fallbacks") or []])
PY
STOP_AT=${STOP_AT:-520} T=${T:-150} gpu_test autoapply_gpu tests/test_autoapply_gpu.py
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
