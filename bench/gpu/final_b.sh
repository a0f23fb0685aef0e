# One device call: every GPU test but the scripts suite (each file in its own process, so that
# one crash cannot hide the others), then part of the scripts suite ($1).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh; export SETUP_DONE=1
O=$(cd "$OUT" && pwd)
for f in $(grep -l "mark.gpu\|pytest.mark.gpu" tests/test_*.py | grep -v scripts_suite); do
  timeout 200 python3 -m pytest -q -m gpu "$f" -p no:cacheprovider --tb=short >> "$O/gpu_tests.log" 2>&1
  echo "$f rc $? $(tail -1 "$O/gpu_tests.log")"
done
grep -E "^FAILED|^E  |Fatal" "$O/gpu_tests.log" | head -20
[ -n "${1:-}" ] && bash bench/gpu/suite_part.sh "$1"
echo "total $(( $(date +%s) - t0 )) s"
