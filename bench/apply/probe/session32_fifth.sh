# One H200, session 32, fifth call (issue 24): the working tree with max_batch 16 by default (plan.DEFAULT_MAX_BATCH):
# the GPU tests of batching, the runtime and apply; `profile examples/wdl_workload.py --threads 64 --apply --p99-ms 8`;
# then the default against MAX_BATCH=32, coroutines and threads, Q = 8-128, 2 rounds, alternating.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
STOP_AT=150
T=60 gpu_test batching_gpu tests/test_batching_gpu.py
T=60 gpu_test runtime_gpu tests/test_runtime_gpu.py
T=80 gpu_test apply_gpu tests/test_apply_gpu.py
grep -h -E "^(FAILED|ERROR)" $OUT/*.log | head -20
W=/tmp/apply64
timeout 110 recsys-doctor profile examples/wdl_workload.py --threads 64 --apply --p99-ms 8 --no-history --out $W > "$OUT/apply64.txt" 2>&1
echo "apply rc=$? [${SECONDS}s]"; grep -E "^│g|queries/s   |p99 ms|kept" "$OUT/apply64.txt" | cut -c1-120
one() {  # $1 name (mb16 = the default, mb32), $2 round
  if [ $1 = mb32 ]; then export MAX_BATCH=32; else unset MAX_BATCH; fi
  OUT=$OUT/grid NAME=$1_round$2.json QS=8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=runtime_batched_async,runtime_batched_call \
    timeout 70 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo "[$1 $2 ${SECONDS}s]"
  unset MAX_BATCH
}
[ $SECONDS -lt 300 ] && one mb16 1 && one mb32 1
[ $SECONDS -lt 330 ] && one mb32 2 && one mb16 2
python3 - "$OUT"/grid <<'PY'
import json, sys, glob, collections
d = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/mb*_round?.json")):
    v = f.rsplit("/", 1)[1].split("_")[0]
    for r in json.load(open(f)):
        d[(r["config"], r["Q"], v)].append(r)
for c in ("runtime_batched_async", "runtime_batched_call"):
    for q in (8, 16, 32, 64, 128):
        a, b = d.get((c, q, "mb16")), d.get((c, q, "mb32"))
        if a and b:
            ma, mb = (sum(r["qps"] for r in x) / len(x) for x in (a, b))
            print(f"{c[15:]:6s} Q={q:3d} default(16) {ma:7.0f} p99 {max(r['p99_ms'] for r in a):.1f} | 32 {mb:7.0f} p99 "
                  f"{max(r['p99_ms'] for r in b):.1f} | {ma / mb:.2f}x")
PY
for f in apply.json plan.json; do [ -f $W/$f ] && cp $W/$f "$OUT/apply64_$f"; done
(cd $OUT && tar czf grid.tgz grid apply64_*.json 2>/dev/null && rm -rf grid apply64_*.json)
echo "done [${SECONDS}s]"
