# Issue 25, one device call: the hook's GPU tests (each file in its own process), then
# examples/plain_serving_script.py through profile --apply and apply --compare
# (bench/apply/apply_acceptance.sh script). OUT=/path bash bench/apply/probe/route_check.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
for f in ${FILES:-test_autoapply_gpu test_apply_gpu}; do
  timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -m gpu tests/$f.py -p no:cacheprovider > $OUT/$f.log 2>&1
  echo "$f rc $? $(tail -1 $OUT/$f.log)"
done
[ "${KEEP:-1}" = 1 ] && OUT=$OUT/keep bash bench/apply/apply_acceptance.sh script 2>&1 | grep -E "rc=|queries/s|qps|chosen|x " | head -20
true
