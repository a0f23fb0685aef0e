# One device call: every GPU test but the scripts suite, issue 25's two keep-targets
# (plain_serving_script >= 15x, wdl_workload >= 25x) and part of the scripts suite ($1).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh; export SETUP_DONE=1
O=$(cd "$OUT" && pwd)
timeout 200 python3 -m pytest -q -m gpu tests -k "not scripts_suite" -p no:cacheprovider > "$O/gpu_tests.log" 2>&1
echo "gpu tests rc $?"; grep -E "passed|failed|^FAILED|^E  " "$O/gpu_tests.log" | tail -12
OUT=/tmp/acc bash bench/apply/apply_acceptance.sh script wdl > "$O/acceptance.log" 2>&1
grep -E "rc=|before|after|ratio|q/s|chosen|WALL" "$O/acceptance.log" | head -40
tar czf "$O/acceptance.tgz" -C /tmp acc
[ -n "${1:-}" ] && bash bench/gpu/suite_part.sh "$1"
echo "total $(( $(date +%s) - t0 )) s"
