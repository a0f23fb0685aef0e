# One H200, session 32, fourth call (issue 24): how the driver sizes a batch when other groups are free.
# The working tree has an experiment's switch (RECSYS_DOCTOR_SPLIT, runtime/_batcher.py's _next; not kept
# in the tree): "free" takes at most ceil(queued / (free groups + 1)) while another group is free, "half"
# at most half the queue. Against the default (max_batch 32, the whole queue up to 32) and MAX_BATCH=16;
# coroutines and threads, Q = 8-128, 2 rounds, the variants' order reversed in the second.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
one() {  # $1 variant (base, mb16, free, half), $2 round
  local mb=32 sp=""; [ $1 = mb16 ] && mb=16; [ $1 = free ] || [ $1 = half ] && sp=$1
  RECSYS_DOCTOR_SPLIT=$sp MAX_BATCH=$mb OUT=$OUT/grid NAME=$1_round$2.json QS=8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=60 \
    CONFIGS=runtime_batched_async,runtime_batched_call timeout 100 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '
  echo "[$1 $2 ${SECONDS}s]"
}
for v in base mb16 free half; do one $v 1; done
for v in half free mb16 base; do [ $SECONDS -lt 430 ] && one $v 2; done
python3 - "$OUT"/grid <<'PY'
import json, sys, glob, collections
d = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*_round?.json")):
    v = f.rsplit("/", 1)[1].split("_")[0]
    for r in json.load(open(f)):
        d[(r["config"], r["Q"], v)].append(r)
for c in ("runtime_batched_async", "runtime_batched_call"):
    for q in (8, 16, 32, 64, 128):
        base = d.get((c, q, "base"))
        if not base:
            continue
        b = sum(r["qps"] for r in base) / len(base)
        cells = []
        for v in ("base", "mb16", "free", "half"):
            rs = d.get((c, q, v), [])
            if rs:
                m = sum(r["qps"] for r in rs) / len(rs)
                cells.append(f"{v} {m:7.0f} ({m / b:.2f}x, p99 {max(r['p99_ms'] for r in rs):.1f})")
        print(f"{c[15:]:6s} Q={q:3d} " + " | ".join(cells))
PY
(cd $OUT && tar czf grid.tgz grid && rm -rf grid)
echo "done [${SECONDS}s]"
