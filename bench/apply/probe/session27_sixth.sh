# (The busy-stream test it runs was dropped after the sixth call: it passed on the code before the fix too;
# its three forms are described in ../results/session27_h200/README.md, the third is busy_probe.py's.)
# One H200, session 27, sixth call: the busy-stream GPU test, its mark now made with a counter holding a
# large negative count and its zeroing queued behind a 10 ms kernel (the fourth and fifth calls' forms, which
# left that to the allocator's reuse of memory, passed on the old code too), on
# the fixed code and on the code before the fix (revert_mark_fix.py order / all), each of those
# expected to fail; the files restored after.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
K=test_a_thread_graph_captured_while_its_group_stream_is_busy_keeps_an_exact_read_mark
T=60 gpu_test busy_fixed tests/test_autoapply_gpu.py -k $K
cp -r recsys_doctor/applying/_autoapply /tmp/aa_backup
for v in order all; do
  python3 bench/apply/probe/revert_mark_fix.py $v && T=60 gpu_test busy_old_$v tests/test_autoapply_gpu.py -k $K
  grep -m2 "^E " $OUT/busy_old_$v.log | cut -c1-220
  cp /tmp/aa_backup/*.py recsys_doctor/applying/_autoapply/
done
T=60 gpu_test busy_fixed_again tests/test_autoapply_gpu.py -k $K
echo "done [${SECONDS}s]"
