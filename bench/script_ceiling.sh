#!/usr/bin/env bash
# The plain script's ceiling, in one run on the GPU machine: the script as it is (eager, 8
# threads), the script under the start-up hook (a plan of G graphed groups, no change to the
# script), and the hand-written servers of bench/serve_anchors.py at Q=8 that keep the
# script's per-tensor copies (graph + stream per thread) or not (pre-packed). Results under
# $OUT/script_ceiling/.  usage: OUT=dir bash bench/script_ceiling.sh [G...]   (default: 4 8)
set -u
OUT=${OUT:-out}/script_ceiling; mkdir -p "$OUT"
py=${PYTHON:-python3}
for round in 1 2; do
  $py examples/plain_serving_script.py --threads 8 --duration 2 | tail -1 > "$OUT/eager_$round.json"
  for g in ${*:-4 8}; do
    echo "{\"runtime\": {\"groups\": $g, \"cuda_graphs\": true}}" > "$OUT/plan_g$g.json"
    $py -m recsys_doctor apply "$OUT/plan_g$g.json" -- $py examples/plain_serving_script.py --threads 8 --duration 2 \
      2> "$OUT/hook_g${g}_$round.err" | tail -1 > "$OUT/hook_g${g}_$round.json"
  done
  OUT=$OUT QS=8 DUR=2 CONFIGS=eager_1stream,graph_pertensor,graph_prepacked NAME=anchors_$round.json \
    $py bench/serve_anchors.py > "$OUT/anchors_$round.log" 2>&1
done
$py - "$OUT" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(os.path.join(out, "*_[12].json"))):
    name = os.path.basename(f)[:-5]
    d = json.load(open(f))
    if "qps_table" in d:
        for c, v in d["qps_table"]["8"].items():
            rows[f"{c}_{name[-1]}"] = v
    else:
        rows[name] = d.get("qps")
print(json.dumps(rows, indent=1))
json.dump(rows, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
