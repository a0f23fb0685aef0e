# Ninth session: a padded call whose padded graph exists copies its real rows into the graph's
# inputs (no padded tensors made), and a slot keeps up to 256 shapes' views: the hook's GPU
# tests, then the candidates ranker (per-request candidate counts: partial batches) against the
# tree before (out/old, carried), with its unhooked run; optionally its suite row (SUITE=candidates).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32 SETUP_DONE=1
timeout 200 python3 -m pytest -q -m gpu tests/test_autoapply_gpu.py -p no:cacheprovider --tb=short > $OUT/test_autoapply_gpu.log 2>&1
echo "autoapply rc $? $(tail -n 1 $OUT/test_autoapply_gpu.log)"
grep -E "^(FAILED|E  )" $OUT/test_autoapply_gpu.log | head -10
. bench/apply/ab_cases.sh
ab_case $OUT/hook_ab.jsonl base cand0
CASES="${CASES:-cand4}" bash bench/apply/hook_ab.sh out/old ${ROUNDS:-2} 2>&1 | grep -v "^setup\|^NVIDIA"
[ -n "${SUITE:-}" ] && bash bench/gpu/suite_part.sh "$SUITE"
echo "total $(( $(date +%s) - t0 )) s"
