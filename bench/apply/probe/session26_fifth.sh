# One H200, session 26, fifth call: the GPU test that failed with lent outputs in the fourth call
# (test_copies_made_while_the_last_replay_still_runs_wait_for_its_mark: one wrong output of 60),
# run again with lending on and off, alternating, to tell a fault of lending from a flaky one of the
# read mark; then the new lending test once. NOT RUN: no device time was left to start a machine.
# It needs ../results/session26_h200/7_lend/lend_outputs.patch applied (lending is not merged).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
K=test_copies_made_while_the_last_replay_still_runs_wait_for_its_mark
for i in 1 2 3; do
  for lend in 1 0; do
    [ "$SECONDS" -lt 150 ] || break
    RECSYS_DOCTOR_LEND_OUTPUTS=$lend STOP_AT=150 T=40 gpu_test "mark_lend${lend}_$i" tests/test_autoapply_gpu.py -k $K
  done
done
STOP_AT=160 T=30 gpu_test lent_test tests/test_autoapply_gpu.py -k test_thread_graph_outputs_are_lent
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
