#!/usr/bin/env bash
# Same-machine A/B of two trees of the package, interleaved case by case:
#   bash bench/apply/tree_ab.sh OLD_TREE [ROUNDS]
# OLD_TREE: a `git archive` of the other commit (recsys_doctor/, analyzers/, runtime/, reports/)
# unpacked inside this checkout. It is laid out in the installed shape beside it (OLD_TREE.pkg,
# with this tree's compiled pieces) and put first on PYTHONPATH for its runs, so nothing is
# reinstalled between runs. Each round runs every case (bench/apply/ab_cases.sh) under both trees
# back to back, the order alternating by round: hook_ab.sh runs a whole pass of the cases per
# tree, and on the H200 the pass run first in a round was up to 30% faster whichever tree it was
# (bench/apply/results/session25_h200/1_pass_ab/). Rows: $OUT/tree_ab.jsonl, labelled new/old.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
. bench/apply/ab_cases.sh
old=$1; rounds=${2:-3}; J="$OUT/tree_ab.jsonl"
pkg=$(realpath "$old").pkg
rm -rf "$pkg" && mkdir -p "$pkg"
cp -r "$old/recsys_doctor" "$pkg/recsys_doctor"
for d in analyzers runtime reports; do cp -r "$old/$d" "$pkg/recsys_doctor/$d"; done
for so in $(find recsys_doctor -name '*.so'); do cp "$so" "$pkg/$so"; done
cases=${CASES:-"dlrm4 mmoe8 plain4"}
for r in $(seq "$rounds"); do
  order="new old"; [ $((r % 2)) -eq 0 ] && order="old new"
  for c in $cases; do
    for t in $order; do
      if [ "$t" = old ]; then
        (export PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}"; ab_case "$J" old "$c")
      else
        ab_case "$J" new "$c"
      fi
    done
  done
done
