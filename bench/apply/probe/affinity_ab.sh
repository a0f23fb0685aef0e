# Tenth session: does pinning a script's process to a few cores change what the hook reaches?
# Each case of bench/apply/ab_cases.sh (unhooked and hooked) under `taskset -c MASK` (all: no
# mask), masks in the order given; rows in $OUT/affinity_ab.jsonl labelled by mask.
# MASKS="all 0-1 0-3" CASES="dlrm0 dlrm2" bash bench/apply/probe/affinity_ab.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/affinity_ab.jsonl
for m in ${MASKS:-all 0-1 0-3}; do
  pre=""; [ "$m" != all ] && pre="taskset -c $m"
  for c in ${CASES:-dlrm0 dlrm2 tt8 cand0 cand4}; do
    timeout 200 $pre bash -c ". bench/apply/ab_cases.sh; ab_case $J mask_$m $c"
  done
done
