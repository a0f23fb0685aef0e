#!/usr/bin/env bash
# Issue 24's profile --apply with a latency budget (64 threads, --p99-ms 8), then whatif fed
# the bucket costs that run measured, and the apply GPU test of them; on the GPU machine
# (carry .whl and .gpu-libs): results under $OUT (one .tgz: the device returns few files).
# usage: bash bench/apply/whatif_buckets.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
W=/tmp/apply64; R=$OUT/whatif_buckets; mkdir -p $R; cp $OUT/env.json $R/
s=$(date +%s)
timeout ${APPLY_TIMEOUT:-330} recsys-doctor profile examples/wdl_workload.py --threads 64 --apply --p99-ms 8 \
  --no-history --out $W > "$R/apply64.txt" 2>&1
echo "apply rc=$? $(( $(date +%s) - s )) s"; tail -30 "$R/apply64.txt" | cut -c1-200
for f in apply.json plan.json bucket_gpu_us.json; do [ -f $W/$f ] && cp $W/$f "$R/apply64_$f"; done
before=$(ls $W/before/*.sqlite* 2>/dev/null | head -1); echo "before trace: $before"
if [ -n "$before" ] && [ -f $W/bucket_gpu_us.json ]; then
  recsys-doctor whatif "$before" --clients 64 > "$R/whatif_constant.txt" 2>&1; echo "whatif constant rc=$?"
  recsys-doctor whatif "$before" --clients 64 --bucket-costs $W/bucket_gpu_us.json > "$R/whatif_measured.txt" 2>&1
  echo "whatif measured rc=$?"; head -14 "$R/whatif_measured.txt"; tail -6 "$R/whatif_measured.txt"
  recsys-doctor whatif "$before" --clients 64 --bucket-costs $W/bucket_gpu_us.json --json > "$R/whatif_measured.json" 2>&1
fi
timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -m gpu tests/test_apply_gpu.py -p no:cacheprovider > "$R/apply_gpu_tests.log" 2>&1
echo "apply gpu tests rc=$?"; tail -3 "$R/apply_gpu_tests.log"
tar czf $OUT/whatif_buckets.tgz -C $OUT whatif_buckets && rm -rf $R
