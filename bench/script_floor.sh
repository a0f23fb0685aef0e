#!/usr/bin/env bash
# What caps examples/plain_serving_script.py (8 client threads, unmodified) under any start-up
# hook, in one run on the GPU machine, ROUNDS rounds (default 3), each configuration in its own
# process, queries/s:
#   eager          the script as it is (its own loop, one shared stream)
#   copies_only    the script's 28 per-tensor `t.to("cuda", non_blocking=True)` a query and a
#                  stream synchronize, no model at all (bench/copy_cost_diag.py, way `to`)
#   hook           the script's query under the start-up hook, 8 graphed groups (in-process,
#                  the script's own loop: bench/script_query_diag.py)
#   hook_pack      the same with the 28 copies packed by a minimal Python `Tensor.to` that keeps
#                  no safety at all (no flush on first use, no reuse checks): an upper bound for
#                  packing inside the hook
#   floor          that packing plus a CUDA graph per thread whose static inputs are the packed
#                  views, replayed directly (no hook at all): what is left once the copies are
#                  Python-level calls
#   prepacked      inputs already in one pinned buffer (serve_anchors graph_prepacked) through
#                  the script's loop: what the GPU does when the host path is free
# Results: $OUT/script_floor/{rounds.jsonl,summary.json,env.json}.  usage: OUT=dir bash bench/script_floor.sh
set -u
OUT=${OUT:-out}/script_floor; mkdir -p "$OUT"
py=${PYTHON:-python3}
R=${ROUNDS:-3}
: > "$OUT/rounds.jsonl"
for round in $(seq 1 "$R"); do
  e=$($py examples/plain_serving_script.py --threads 8 --duration 2 2>>"$OUT/err.log" | tail -1)
  echo "{\"round\": $round, \"config\": \"eager\", \"result\": ${e:-null}}" >> "$OUT/rounds.jsonl"
  c=$(WAYS=to $py bench/copy_cost_diag.py 8 2>>"$OUT/err.log" | tail -1)
  echo "{\"round\": $round, \"config\": \"copies_only\", \"result\": ${c:-null}}" >> "$OUT/rounds.jsonl"
  for m in hook hook_pack floor prepacked; do
    r=$($py bench/script_query_diag.py $m 8 8 2 2>>"$OUT/err.log" | tail -1)
    echo "{\"round\": $round, \"config\": \"$m\", \"result\": ${r:-null}}" >> "$OUT/rounds.jsonl"
  done
done
$py - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
rows = [json.loads(l) for l in open(os.path.join(out, "rounds.jsonl"))]
table = {}
for r in rows:
    res = r["result"] or {}
    q = res.get("copies", {}).get("to_8") if r["config"] == "copies_only" else res.get("qps")
    table.setdefault(r["config"], []).append(q)
ratios = {c: [round(q / e, 2) if q and e else None for q, e in zip(v, table.get("eager", []))] for c, v in table.items()}
doc = {"qps_per_round": table, "ratio_to_eager_same_round": ratios}
print(json.dumps(doc, indent=1))
json.dump(doc, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
