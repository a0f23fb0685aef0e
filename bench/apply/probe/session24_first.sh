# One H200: a program without a deep-learning framework (examples/cuda_python_serve.py: NVRTC
# kernels launched from 4 Python threads through cuda-python) run as it is, then through
# `recsys-doctor profile` (nsys): its trace (the project's CUDA-framework fixture), the report,
# the JSON; then the GPU test that checks it (tests/test_framework_gpu.py).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1
timeout 90 python3 examples/cuda_python_serve.py --threads 4 --queries 100 > $OUT/plain.txt 2>&1
echo "plain: $(tail -2 $OUT/plain.txt)"
rm -rf /tmp/prof
timeout 240 recsys-doctor profile examples/cuda_python_serve.py --out /tmp/prof \
  -- --threads 4 --queries 150 > $OUT/profile.txt 2>&1
echo "profile rc=$? [${SECONDS}s]"; grep -E "framework|Main problem|In CUDA|error" $OUT/profile.txt | head -8
ls /tmp/prof | head -20
[ -f /tmp/prof/trace.sqlite ] && gzip -c /tmp/prof/trace.sqlite > $OUT/cuda_python_q4.sqlite.gz
recsys-doctor advise /tmp/prof/trace.sqlite --json --no-history > $OUT/advise.json 2> $OUT/advise.err
echo "advise rc=$?"; ls -la $OUT
STOP_AT=420 T=150 gpu_test framework_gpu tests/test_framework_gpu.py
