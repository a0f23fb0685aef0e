#!/usr/bin/env bash
# Same-machine A/B of the hook's own switches (one tree): each case under every setting of
# KNOBS (space-separated; each a comma-separated list of VAR=VALUE, "-" for none), back to back,
# the settings' order alternating by round; with OLD_TREE (a `git archive` of another commit inside this
# checkout), that tree too, as label "old". Rows go to $OUT/knob_ab.jsonl (bench/apply/hooked_run.py).
# usage: CASES="plain4 dlrm4" KNOBS="- RECSYS_DOCTOR_LAUNCH=release-gil" bash bench/apply/knob_ab.sh ROUNDS [OLD_TREE]
# (results/gil_waits_h100/ used it with RECSYS_DOCTOR_LAZY_OUTPUTS, a switch of the patch kept there)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
. bench/apply/ab_cases.sh
rounds=${1:-2}; old=${2:-}; here=$(pwd); J="$OUT/knob_ab.jsonl"
cases=${CASES:-"plain4 dlrm4"}; knobs=${KNOBS:-"-"}
for r in $(seq "$rounds"); do
  order=$knobs; [ $((r % 2)) -eq 0 ] && order=$(echo $knobs | tr ' ' '\n' | tac | tr '\n' ' ')
  # each case under every setting back to back (the settings of one case seconds apart, not a
  # whole pass of the cases: the machine drifted by more than the effects between passes,
  # results/session21_h200/)
  for c in $cases; do
    for k in $order; do
      ( [ "$k" != "-" ] && for kv in ${k//,/ }; do export "$kv"; done; ab_case "$J" "$k" "$c" )
    done
  done
  if [ -n "$old" ]; then
    (cd "$old" && python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1)
    for c in $cases; do ab_case "$J" old "$c"; done
    (cd "$here" && python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1)
  fi
done
