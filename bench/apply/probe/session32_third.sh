# One H200, session 32, third call (issue 24): coroutines and threads at HEAD with 4 driver threads
# (one a group) against the default 2, and with batches of at most 16 (MAX_BATCH=16) against 32,
# Q = 8 / 32 / 64 / 128, 3 rounds, the order of the two sweeps alternating by round.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
C=runtime_batched_async,runtime_batched_async_dr4,runtime_batched_call,runtime_batched_call_dr4
R=$(echo $C | tr ',' '\n' | tac | paste -sd,)
one() {  # $1 name, $2 configs, $3 max batch
  MAX_BATCH=$3 OUT=$OUT/grid NAME=$1.json QS=8,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=$2 \
    timeout 120 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo "[$1 ${SECONDS}s]"
}
for i in 1 2 3; do
  [ $SECONDS -lt 420 ] || break
  if [ $((i % 2)) = 1 ]; then one mb32_round$i $C 32; one mb16_round$i runtime_batched_async,runtime_batched_call 16
  else one mb16_round$i runtime_batched_call,runtime_batched_async 16; one mb32_round$i $R 32; fi
done
python3 - "$OUT"/grid <<'PY'
import json, sys, glob, collections
d = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/mb*_round?.json")):
    mb = f.rsplit("/", 1)[1].split("_")[0]
    for r in json.load(open(f)):
        d[(r["config"] + ("" if mb == "mb32" else "_mb16"), r["Q"])].append((r["qps"], r["p99_ms"]))
for k in sorted(d):
    v = d[k]
    print(f"{k[0]:32s} Q={k[1]:4d} q/s {[round(x) for x, _ in v]} mean {sum(x for x, _ in v) / len(v):8.0f} p99 {[y for _, y in v]}")
PY
(cd $OUT && tar czf grid.tgz grid && rm -rf grid)
echo "done [${SECONDS}s]"
