# Ninth session: the hook's GPU tests on this tree (the pageable copies known again,
# recsys_doctor/applying/_autoapply/pageable_fast.py), then a same-machine A/B against the tree
# before it (out/old: `git archive` of its package, carried) on the DLRM script (from_numpy().cuda()),
# plus its unhooked run. OUT=... bash bench/apply/probe/pageable_fast_ab.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32 SETUP_DONE=1
for f in autoapply runtime; do
  timeout 200 python3 -m pytest -q -m gpu tests/test_${f}_gpu.py -p no:cacheprovider --tb=short > $OUT/test_${f}_gpu.log 2>&1
  echo "$f rc $? $(tail -n 1 $OUT/test_${f}_gpu.log)"
done
grep -E "^(FAILED|E  )" $OUT/test_autoapply_gpu.log | head -20
. bench/apply/ab_cases.sh
ab_case $OUT/hook_ab.jsonl base dlrm0
CASES="${CASES:-dlrm2 dlrm4}" bash bench/apply/hook_ab.sh out/old ${ROUNDS:-2} 2>&1 | grep -v "^setup\|^NVIDIA"
echo "total $(( $(date +%s) - t0 )) s"
