# One H200, session 32, first call (issue 24): the coroutines' timeouts from one timer an event loop
# (89157d1, measured on CPU only so far) on a GPU: the GPU tests that serve batched models and coroutines
# (batching, runtime), then runtime_batched_async and runtime_batched_call at Q = 8-128, HEAD against
# 1b6027d (old_tree, the commit before; two drivers in both), 3 rounds, the tree run first alternating;
# then py-spy --idle of 64 coroutines on HEAD.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
STOP_AT=200
T=60 gpu_test batching_gpu tests/test_batching_gpu.py
T=90 gpu_test runtime_gpu tests/test_runtime_gpu.py
grep -h -E "^(FAILED|ERROR)" $OUT/*.log | head -20
pkg=$(realpath old_tree).pkg
rm -rf "$pkg" && mkdir -p "$pkg" && cp -r old_tree/recsys_doctor "$pkg/recsys_doctor"
for d in analyzers runtime reports; do cp -r old_tree/$d "$pkg/recsys_doctor/$d"; done
for so in $(find recsys_doctor -name '*.so'); do cp "$so" "$pkg/$so"; done
C=runtime_batched_async,runtime_batched_call
sweep() {  # $1 tree (new/old) $2 round
  if [ "$1" = old ]; then export PYTHONPATH="$pkg"; else unset PYTHONPATH; fi
  OUT=$OUT/ab NAME=$1_round$2.json QS=8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=$C \
    timeout 100 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo "[$1 $2 ${SECONDS}s]"
  unset PYTHONPATH
}
for i in 1 2 3; do
  [ $SECONDS -lt 470 ] || break
  if [ $((i % 2)) = 1 ]; then sweep new $i; sweep old $i; else sweep old $i; sweep new $i; fi
done
python3 - "$OUT"/ab <<'PY'
import json, sys, glob, collections
d = collections.defaultdict(list)
for f in sorted(glob.glob(sys.argv[1] + "/*_round*.json")):
    tree = f.rsplit("/", 1)[1].split("_")[0]
    for r in json.load(open(f)):
        if isinstance(r, dict) and "qps" in r:
            d[(r["config"], r["Q"], tree)].append(r["qps"])
for (c, q, t) in sorted(k for k in d if k[2] == "new"):
    n, o = d[(c, q, "new")], d.get((c, q, "old"), [])
    if o:
        print(f"{c:28s} Q={q:4d} new {[round(x) for x in n]} old {[round(x) for x in o]} "
              f"mean ratio {sum(n) / len(n) / (sum(o) / len(o)):.3f}")
PY
if [ $SECONDS -lt 520 ]; then
  python3 bench/serving/serving_sweep.py --one runtime_batched_async 64 10 > "$OUT/pyspy_run.log" 2>&1 &
  P=$!; sleep 7
  py-spy record --idle --threads -r 250 -d 2 -f raw -p $P -o "$OUT/pyspy_idle_async64.txt" > /dev/null 2>&1
  wait $P; grep ROW "$OUT/pyspy_run.log" | cut -c1-160
fi
(cd $OUT && tar czf ab.tgz ab && rm -rf ab && tar czf pyspy.tgz pyspy_* 2>/dev/null && rm -f pyspy_*)
echo "done [${SECONDS}s]"
