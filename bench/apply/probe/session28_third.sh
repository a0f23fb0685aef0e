# One H200, session 28, third call: how far the hooked DLRM (g4, outputs lent) is from what the hook
# could reach without changing the script's own calls. The hand-written graph server's ablation
# (--variant): np (its own scoring), from_numpy (plus the script's three torch.from_numpy tensors),
# cpu_only (plus the script's .cpu().numpy() of the graph's device output: the hook's query minus the
# hook's own Python); the unhooked and hooked script; and MMoE unhooked / hooked / hand-written.
# Three rounds, the order of the cases rotated each round, all on cores 0-7.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
. bench/apply/ab_cases.sh
export AB_PIN="taskset -c 0-7"
cases="dlrm4 hdlrm hdlrm_fn hdlrm_cpu dlrm0 mmoe8 hmmoe"
for r in 1 2 3; do
  for c in $cases; do ab_case $OUT/abl.jsonl r$r $c | cut -c1-150; done
  cases="$(echo $cases | cut -d' ' -f2-) $(echo $cases | cut -d' ' -f1)"
  [ "$SECONDS" -lt 400 ] || break
done
[ "$SECONDS" -lt 480 ] && ab_case $OUT/abl.jsonl r1 mmoe0 | cut -c1-150
python3 - <<'PY'
import json, os, collections
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/abl.jsonl")]
by = collections.defaultdict(list)
for r in rows:
    res = r
    key = (r["script"], r.get("groups"), " ".join(a for a in r.get("args", []) if a.startswith(("from", "cpu"))))
    by[key].append(res.get("qps"))
for k, v in by.items(): print(k, v)
PY
echo "done [${SECONDS}s]"
