#!/usr/bin/env bash
# copy the small result files of bench/apply/apply_acceptance.sh runs from $1 to $2 (flat names)
src=$1; dst=$2; mkdir -p "$dst"
for w in wdl script mmoe; do
  for f in apply.json plan.json compare.html; do [ -f "$src/$w/$f" ] && cp "$src/$w/$f" "$dst/${w}_$f"; done
  for f in "$src/$w.txt" "$src/$w.err"; do [ -f "$f" ] && cp "$f" "$dst/"; done
done
for f in "$src"/script_apply_compare.json "$src"/script_apply_compare.err "$src"/apply_gpu_tests.log; do [ -f "$f" ] && cp "$f" "$dst/"; done
[ -f "$src/script/program.log" ] && tail -c 20000 "$src/script/program.log" > "$dst/script_program_tail.log"
true
