# Ninth session, fourth call: the hook's GPU tests with the slot event recorded through the
# driver keeping the GIL, then a same-machine A/B against the tree before it (out/old, carried:
# `git archive` of 0c6e784's package) on the scripts whose copies go through the slots.
# (the change measured here was not kept: no gain beyond the machine's spread, bench/apply/results/pageable_fast_h100/record_ab/)
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
for f in autoapply apply; do
  timeout 200 python3 -m pytest -q -m gpu tests/test_${f}_gpu.py -p no:cacheprovider --tb=short > $OUT/test_${f}_gpu.log 2>&1
  echo "$f rc $? $(tail -n 1 $OUT/test_${f}_gpu.log)"
done
grep -E "^(FAILED|E  )" $OUT/test_autoapply_gpu.log | head -20
CASES="${CASES:-dlrm2 tt4}" bash bench/apply/hook_ab.sh out/old ${ROUNDS:-2} 2>&1 | grep -v "^setup\|^NVIDIA"
echo "total $(( $(date +%s) - t0 )) s"
