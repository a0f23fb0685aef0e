# (Ran with the read-back of ../results/session27_h200/host_reads/host_reads.patch applied; not merged.)
# One H200, session 27, third call, after the read-mark fix (thread_graphs._capture_thread: the group
# stream synchronized after the mark's counter is zeroed, not before; ReadMark.captured refuses a base
# other than the eager run's one count): the hook's GPU tests (with the new busy-stream test that
# reproduces the fault deterministically, and the graphs' own read-back); mark_race.py with lending on;
# a same-tree A/B of lending + read-back against neither, DLRM g4 and MMoE g8, 3 rounds on the same 8
# cores; eight held-out scripts hooked (g2), checksums against their unhooked runs of session 25.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=60 T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
for i in 1 2 3; do
  [ "$SECONDS" -lt 200 ] || break
  timeout 60 python3 bench/apply/probe/mark_race.py --iters 8 > $OUT/mark_race_$i.txt 2>&1
  echo "mark_race lend=1 round $i: $(grep -c WRONG $OUT/mark_race_$i.txt) wrong; bases $(grep -o "'base': [-0-9]*" $OUT/mark_race_$i.txt | sort | uniq -c | tr '\n' ' ') [${SECONDS}s]"
done
CASES="dlrm4 mmoe8" KNOBS="- RECSYS_DOCTOR_HOST_OUTPUTS=0,RECSYS_DOCTOR_LEND_OUTPUTS=0" AB_PIN="taskset -c 0-7" \
  bash bench/apply/knob_ab.sh 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-120
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
