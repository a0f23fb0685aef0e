export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
python3 -c "from recsys_doctor.runtime import _handoff; print('handoff built', _handoff.__file__)"
OUT=$OUT NAME=sweep_handoff.json QS=1,8,32,64,128 CONFIGS=handroll_prepacked,runtime_batched_call,runtime_batched_call_py,runtime_batched_async,runtime_batched_submit DUR=1 timeout 200 python3 bench/serving/serving_sweep.py > $OUT/sweep.log 2>&1
grep -v "^#" $OUT/sweep.log | cut -c1-150
timeout 330 python3 -m pytest -q -m gpu tests -p no:cacheprovider -x > $OUT/gpu_tests_all.log 2>&1; echo "gpu tests rc=$?"; tail -5 $OUT/gpu_tests_all.log
