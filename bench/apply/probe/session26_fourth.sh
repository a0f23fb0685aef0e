# (Ran on cd6ad9e; lending was not merged after it: ../results/session26_h200/7_lend/lend_outputs.patch.)
# One H200, session 26, fourth call, on the thread graphs' lent outputs (_autoapply/lentout.py: the
# replay hands the script the graph's own output tensors, no clone; checked free at the next replay):
# the hook's GPU tests (with the new one: outputs lent, views and .detach() kept), then a same-tree
# A/B of lending against clones (RECSYS_DOCTOR_LEND_OUTPUTS=0) on DLRM (g4) and MMoE (g8), 3 rounds
# on the same 8 cores, then eight held-out scripts hooked (g2), each checksum against its unhooked
# run of session 25 (../session25_h200/6_heldout/heldout.jsonl: the checksums do not depend on the machine).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=60 T=130 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=200 T=60 gpu_test apply_gpu tests/test_apply_gpu.py
CASES="dlrm4 mmoe8" KNOBS="- RECSYS_DOCTOR_LEND_OUTPUTS=0" AB_PIN="taskset -c 0-7" bash bench/apply/knob_ab.sh 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-110
. bench/apply/ab_cases.sh
for c in jag opt topk pipe aio amp ref early; do
  [ "$SECONDS" -lt 540 ] || break
  ab_case $OUT/heldout.jsonl hooked "${c}2" > /dev/null
done
python3 - <<'PY'
import json, os
ref = {r["script"]: r["checksum"] for r in map(json.loads, open("bench/apply/results/session25_h200/6_heldout/heldout.jsonl"))
       if r["label"] == "unhooked"}
for r in map(json.loads, open(os.environ["OUT"] + "/heldout.jsonl")):
    h = r.get("hook") or {}
    print(r["script"], r.get("qps"), "checksum equal:", r.get("checksum") == ref.get(r["script"]), "tr", h.get("thread_replays"),
          "lent", h.get("outputs_lent"), "fb", [k[:50] for k in h.get("fallbacks") or []][:2])
PY
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
