# One H200, session 31, fourth call (issue 24): a second driver thread that starts batches only while at least
# 16 requests (4 per group) are queued or running (helpers_from, in the working tree; RECSYS_DOCTOR_HELPERS_FROM
# is the experiment's switch: "none" = at any load, as drivers=2 was) against one driver and against the
# ungated second driver: the batched call and coroutines, Q = 1..128, 3 rounds, order rotating. Then the
# batching GPU tests.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
one() {  # label round
  unset RECSYS_DOCTOR_HELPERS_FROM
  case $1 in
    d1) C=runtime_batched_call;; g2) C=runtime_batched_call_dr2;;
    u2) C=runtime_batched_call_dr2; export RECSYS_DOCTOR_HELPERS_FROM=none;;
    a1) C=runtime_batched_async;; ag2) C=runtime_batched_async_dr2;;
  esac
  OUT=$OUT/ab NAME=$1_r$2.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=$C \
    timeout 60 python3 bench/serving/serving_sweep.py > /dev/null 2>&1; echo -n "$1 r$2 [${SECONDS}s] "
}
for r in 1 2 3; do
  case $r in 1) o="d1 g2 u2 a1 ag2";; 2) o="ag2 a1 u2 g2 d1";; 3) o="g2 d1 ag2 u2 a1";; esac
  for l in $o; do one $l $r; done
done
unset RECSYS_DOCTOR_HELPERS_FROM; echo
OUT=$OUT/ab NAME=hand.json QS=1,4,8,16,32,64,128 DUR=1 CONFIGS=handroll_prepacked timeout 60 python3 bench/serving/serving_sweep.py > /dev/null 2>&1
for l in d1 g2 u2 a1 ag2; do echo "== $l"; python3 bench/serving/sweep_table.py $OUT/ab/${l}_r*.json | tail -1; done
python3 bench/serving/sweep_table.py $OUT/ab/hand.json
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
T=120 gpu_test batching_gpu tests/test_batching_gpu.py
echo "done [${SECONDS}s]"
