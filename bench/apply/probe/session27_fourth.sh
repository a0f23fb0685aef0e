# (The busy-stream test it runs was dropped after the sixth call: it passed on the code before the fix too;
# its three forms are described in ../results/session27_h200/README.md, the third is busy_probe.py's.)
# One H200, session 27, fourth call: (1) the new busy-stream GPU test on the fixed code, then on the
# code as it was before the fix (revert_mark_fix.py: the ordering only, so the new check refuses the
# graph; then the check too: wrong outputs), each expected to fail, the files restored after;
# (2) the hook's and apply's GPU tests (host reads taken out again: results/session27_h200/host_reads);
# (3) lending against clones, same tree, DLRM g4 and MMoE g8, 4 rounds on the same 8 cores;
# (4) the held-out early_pool (inference mode) and amp ranker hooked (g2).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
K=test_a_thread_graph_captured_while_its_group_stream_is_busy_keeps_an_exact_read_mark
T=60 gpu_test busy_fixed tests/test_autoapply_gpu.py -k $K
cp -r recsys_doctor/applying/_autoapply /tmp/aa_backup
python3 bench/apply/probe/revert_mark_fix.py order && T=60 gpu_test busy_old_order tests/test_autoapply_gpu.py -k $K
grep -m3 "assert\|Error" $OUT/busy_old_order.log | cut -c1-200
cp /tmp/aa_backup/*.py recsys_doctor/applying/_autoapply/
python3 bench/apply/probe/revert_mark_fix.py all && T=60 gpu_test busy_old_all tests/test_autoapply_gpu.py -k $K
grep -m3 "assert\|Error" $OUT/busy_old_all.log | cut -c1-200
cp /tmp/aa_backup/*.py recsys_doctor/applying/_autoapply/
git diff --stat recsys_doctor/applying/_autoapply/readmark.py recsys_doctor/applying/_autoapply/thread_graphs.py 2>/dev/null | tail -1
STOP_AT=150 T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=260 T=60 gpu_test apply_gpu tests/test_apply_gpu.py
CASES="dlrm4 mmoe8" KNOBS="- RECSYS_DOCTOR_LEND_OUTPUTS=0" AB_PIN="taskset -c 0-7" \
  bash bench/apply/knob_ab.sh 4 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-120
. bench/apply/ab_cases.sh
for c in early2 amp2; do
  [ "$SECONDS" -lt 560 ] || break
  ab_case $OUT/heldout.jsonl hooked "$c" | cut -c1-200
done
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
