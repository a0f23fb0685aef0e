# Run part of issue 25's scripts suite on the GPU machine (tests/test_scripts_suite_gpu.py):
#   bash bench/gpu/suite_part.sh "dlrm or deepfm"
# Writes $OUT/scripts_suite.json (the rows), $OUT/suite.log and $OUT/suite_runs.tgz (each
# script's profile --apply directory: apply.json, program logs, reports).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/scripts_suite.json
python3 -m pytest -q -m gpu tests/test_scripts_suite_gpu.py -k "$1" --basetemp=/tmp/suite -p no:cacheprovider > "$OUT/suite.log" 2>&1
echo "pytest rc $?"; tail -30 "$OUT/suite.log"
tar czf "$OUT/suite_runs.tgz" -C /tmp suite --exclude='*.nsys-rep' --exclude='*.sqlite' 2>/dev/null
echo "total $(( $(date +%s) - t0 )) s"
