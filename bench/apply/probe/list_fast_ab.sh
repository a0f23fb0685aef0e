# Ninth session: lists made into tensors by numpy where that is the same tensor
# (_autoapply/pageable_fast.list_array) and the copy's stream read as a raw handle: the hook's
# GPU tests, a same-machine A/B against the tree before (out/old, carried) on the two-tower
# script, then its suite row through profile --apply ($OUT/scripts_suite.json, suite.log).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32 SETUP_DONE=1
timeout 200 python3 -m pytest -q -m gpu tests/test_autoapply_gpu.py -p no:cacheprovider --tb=short > $OUT/test_autoapply_gpu.log 2>&1
echo "autoapply rc $? $(tail -n 1 $OUT/test_autoapply_gpu.log)"
CASES="${CASES:-tt8}" bash bench/apply/hook_ab.sh out/old ${ROUNDS:-2} 2>&1 | grep -v "^setup\|^NVIDIA"
bash bench/gpu/suite_part.sh "${SUITE:-two_tower}"
echo "total $(( $(date +%s) - t0 )) s"
