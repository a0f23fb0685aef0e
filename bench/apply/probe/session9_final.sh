# Ninth session, final call: the DLRM script of the suite through profile --apply on the final
# code (tests/test_scripts_suite_gpu.py -k dlrm: $OUT/scripts_suite.json, suite.log, suite_runs.tgz),
# then issue 25's keep-targets (bench/apply/probe/keep_targets.sh: $OUT/keep.tgz).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32 SETUP_DONE=1
bash bench/gpu/suite_part.sh "${SUITE:-dlrm}"
bash bench/apply/probe/keep_targets.sh
echo "total $(( $(date +%s) - t0 )) s"
