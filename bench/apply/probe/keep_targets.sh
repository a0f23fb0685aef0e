# Issue 25's keep-targets on the GPU machine, one call: bench/apply/apply_acceptance.sh wdl
# script tests (wdl_workload and plain_serving_script through profile --apply, apply --compare
# of the plain script's plan, test_apply_gpu), packed into $OUT/keep.tgz.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
OUT=$OUT/keep bash bench/apply/apply_acceptance.sh wdl script tests 2>&1 | grep -E "rc=|WALL|queries/s  |tests rc|passed|failed" | head -20
tar czf $OUT/keep.tgz -C $OUT --exclude='*.db' keep && rm -rf $OUT/keep
