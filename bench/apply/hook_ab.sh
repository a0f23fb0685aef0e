#!/usr/bin/env bash
# Same-machine A/B of two trees of the hook: bash bench/apply/hook_ab.sh OLD_TREE ROUNDS
# (OLD_TREE: a `git archive` of the other commit, unpacked inside this checkout). Each round
# installs one tree, runs every case (bench/apply/ab_cases.sh), then the other (order alternating); rows go to
# $OUT/hook_ab.jsonl labelled new/old. Sourced set-up: bench/gpu/gpu_setup.sh.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
. bench/apply/ab_cases.sh
old=$1; rounds=${2:-2}; here=$(pwd); J="$OUT/hook_ab.jsonl"
cases=${CASES:-"plain4 plain8 dlrm4 mmoe8"}
one() {  # label tree
  (cd "$2" && python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1) || echo "install $2 failed"
  for c in $cases; do ab_case "$J" "$1" "$c"; done
}
for r in $(seq "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then one new "$here"; one old "$old"; else one old "$old"; one new "$here"; fi
done
(cd "$here" && python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1)
