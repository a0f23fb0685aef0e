# One device call: build the prototype, then two rounds of the sweep's hand-roll, the
# runtime's batched call and the C-driver prototype, each configuration in its own process
# (round 2 in the reverse order). Results in $OUT/cdriver.tgz.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
bash bench/serving/cdriver/build.sh || { echo "build failed"; exit 1; }
O=/tmp/cdriver; mkdir -p "$O"
cp "$OUT/env.json" "$O/"
QS=${QS:-1,8,32,64,128}
OUT=$O NAME=round1.json QS=$QS DUR=${DUR:-1.5} CONFIGS=handroll_prepacked,runtime_batched_call,proto_cdriver \
  python3 bench/serving/serving_sweep.py > "$O/round1.log" 2>&1
OUT=$O NAME=round2.json QS=$QS DUR=${DUR:-1.5} CONFIGS=proto_cdriver,runtime_batched_call,handroll_prepacked \
  python3 bench/serving/serving_sweep.py > "$O/round2.log" 2>&1
grep -h '^{' "$O"/round*.log | python3 -c "
import json,sys
for l in sys.stdin:
    r=json.loads(l); print(r['config'], r['Q'], r.get('qps'), r.get('p99_ms'), r.get('max_abs_err'), (r.get('errors') or '')[:1])"
tar czf "$OUT/cdriver.tgz" -C "$O" . && echo "total $(( $(date +%s) - t0 )) s"
