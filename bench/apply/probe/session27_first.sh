# (Ran with the read-back of ../results/session27_h200/host_reads/host_reads.patch applied; not merged.)
# One H200, session 27, first call. (1) The read-mark scenario that gave one wrong output with lent
# outputs in session 26 (mark_race.py: many iterations in one process, each query's path logged),
# lending on and off, alternating. (2) The hook's GPU tests with lending and the graphs' own
# read-back of small outputs (_autoapply/hostout.py). (3) A same-tree A/B on the same 8 cores:
# both on, read-back off, both off; DLRM g4, MMoE g8, DeepFM g4; with the hand-written DLRM server.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
for i in 1 2; do
  for lend in 1 0; do
    [ "$SECONDS" -lt 170 ] || break
    RECSYS_DOCTOR_LEND_OUTPUTS=$lend timeout 60 python3 bench/apply/probe/mark_race.py --iters 8 \
      > $OUT/mark_race_lend${lend}_$i.txt 2>&1
    echo "mark_race lend=$lend round $i: $(grep -c WRONG $OUT/mark_race_lend${lend}_$i.txt) wrong; $(tail -1 $OUT/mark_race_lend${lend}_$i.txt | cut -c1-160) [${SECONDS}s]"
  done
done
STOP_AT=230 T=130 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=300 T=60 gpu_test apply_gpu tests/test_apply_gpu.py
export AB_PIN="taskset -c 0-7"
KN="- RECSYS_DOCTOR_HOST_OUTPUTS=0 RECSYS_DOCTOR_HOST_OUTPUTS=0,RECSYS_DOCTOR_LEND_OUTPUTS=0"
. bench/apply/ab_cases.sh
CASES="dlrm4 mmoe8 dfm4" KNOBS="$KN" bash bench/apply/knob_ab.sh 2 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-120
for r in 1 2; do ab_case $OUT/knob_ab.jsonl hand hdlrm | cut -c1-120; done
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
