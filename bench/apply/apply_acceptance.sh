#!/usr/bin/env bash
# issue 5 acceptance for --apply on the GPU machine; results land under $OUT (default ./out).
# usage: bash bench/apply/apply_acceptance.sh [wdl] [script] [mmoe] [tests]
OUT=${OUT:-out}; mkdir -p "$OUT"
what=${*:-wdl script mmoe tests}
py=${PYTHON:-python3}
rd() { $py -m recsys_doctor "$@"; }
for w in $what; do
  case $w in
    wdl)
      /usr/bin/time -f "WALL wdl %e s" timeout 300 $py -m recsys_doctor profile examples/wdl_workload.py --threads 8 --apply --top-k ${TOPK:-3} \
        --out "$OUT/wdl" --db "$OUT/history.db" > "$OUT/wdl.txt" 2> "$OUT/wdl.err"; echo "wdl rc=$?"; tail -40 "$OUT/wdl.txt"; tail -5 "$OUT/wdl.err";;
    script)
      /usr/bin/time -f "WALL script %e s" timeout 300 $py -m recsys_doctor profile --apply examples/plain_serving_script.py \
        --out "$OUT/script" --db "$OUT/history.db" > "$OUT/script.txt" 2> "$OUT/script.err"; echo "script rc=$?"; tail -25 "$OUT/script.txt"; tail -8 "$OUT/script.err"
      [ -f "$OUT/script/plan.json" ] && timeout 120 $py -m recsys_doctor apply --compare --json "$OUT/script/plan.json" -- \
        $py examples/plain_serving_script.py > "$OUT/script_apply_compare.json" 2> "$OUT/script_apply_compare.err"; echo "apply rc=$?"; cat "$OUT/script_apply_compare.json"; tail -5 "$OUT/script_apply_compare.err";;
    mmoe)
      /usr/bin/time -f "WALL mmoe %e s" timeout 300 $py -m recsys_doctor profile examples/mmoe_training.py --apply \
        --out "$OUT/mmoe" --db "$OUT/history.db" > "$OUT/mmoe.txt" 2> "$OUT/mmoe.err"; echo "mmoe rc=$?"; tail -25 "$OUT/mmoe.txt"; tail -5 "$OUT/mmoe.err";;
    tests)
      timeout 240 $py -m pytest -q -m gpu tests/test_apply_gpu.py -p no:cacheprovider > "$OUT/apply_gpu_tests.log" 2>&1; echo "tests rc=$?"; tail -15 "$OUT/apply_gpu_tests.log";;
  esac
done
# drop the bulky traces, keep the JSON/HTML/logs
find "$OUT" \( -name '*.nsys-rep' -o -name '*.sqlite' -o -name 'trace.json' \) -delete 2>/dev/null
true
