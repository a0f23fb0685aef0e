# Run part of issue 25's scripts suite on the GPU machine (tests/test_scripts_suite_gpu.py):
#   bash bench/gpu/suite_part.sh "dlrm or deepfm"
# Writes $OUT/scripts_suite.json (the rows), $OUT/suite.log and $OUT/suite_runs.tgz (each
# script's profile --apply directory: apply.json, the program logs, the terminal report).
export CUDA_DEVICE_MAX_CONNECTIONS=32
t0=${t0:-$(date +%s)}
[ -n "${SETUP_DONE:-}" ] || . bench/gpu/gpu_setup.sh
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/scripts_suite.json
python3 -m pytest -q -m gpu tests/test_scripts_suite_gpu.py -k "$1" --basetemp=/tmp/suite -p no:cacheprovider > "$OUT/suite.log" 2>&1
echo "pytest rc $?"; grep -E "^(E  |FAILED|PASSED)|passed|failed" "$OUT/suite.log" | tail -12
O=$(cd "$OUT" && pwd); (cd /tmp && find suite \( -name '*.json' -o -name '*.log' -o -name '*.txt' \) -size -2M -print0 | tar czf "$O/suite_runs.tgz" --null -T -)
echo "total $(( $(date +%s) - t0 )) s"
