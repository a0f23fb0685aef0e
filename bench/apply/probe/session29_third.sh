# One H200, session 29, third call: issue 24's batched served() with callers serving themselves on a
# free group while fewer requests run than groups (runtime/_batcher.py) against the tree before it
# (old_tree: HEAD's git archive, carried). (1) the batching GPU tests on the new code; (2) serving_sweep.py,
# Q = 1..64, runtime_request (8 groups), runtime_batched_call (4 groups) and _g8 (8 groups), each
# tree installed in turn, 3 rounds, order alternating; the hand-roll once a round.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
T=150 gpu_test batching_gpu tests/test_batching_gpu.py
here=$PWD
inst() { (cd "$1" && python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1) || echo "install $1 failed"; }
sweep() {  # label round configs
  OUT=$OUT/sweeps NAME=$1_$2.json QS=1,2,4,8,16,32,64 CONFIGS=$3 DUR=1 CONFIG_TIMEOUT=100 \
    python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | sed "s/^/$1 $2 /"
}
mkdir -p $OUT/sweeps
for r in 1 2 3; do
  [ "$SECONDS" -lt 480 ] || break
  if [ $((r % 2)) -eq 1 ]; then order="new old"; else order="old new"; fi
  for t in $order; do
    if [ $t = old ]; then inst old_tree; else inst "$here"; fi
    c=runtime_request,runtime_batched_call,runtime_batched_call_g8
    [ $t = new ] && c=$c,handroll_prepacked
    sweep $t $r $c
  done
done
inst "$here"
python3 - <<'PY'
import json, os, glob, collections
by = collections.defaultdict(list)
for f in sorted(glob.glob(os.environ["OUT"] + "/sweeps/*_[0-9].json")):
    t = os.path.basename(f).split("_")[0]
    for r in json.load(open(f)):
        if r.get("qps"):
            by[(r["config"], t, r["Q"])].append(r["qps"])
            if r.get("max_abs_err", 0) > 1e-5 or r.get("errors"): print("BAD", f, r["config"], r["Q"], r.get("max_abs_err"), r.get("errors"))
cfgs = sorted({k[0] for k in by}); qs = sorted({k[2] for k in by})
for c in cfgs:
    for t in ("new", "old"):
        row = [f"{sum(v)/len(v):8.0f}" if (v := by.get((c, t, q))) else "       -" for q in qs]
        print(f"{c:28s} {t} " + " ".join(row))
PY
echo "done [${SECONDS}s]"
(cd $OUT && tar czf sweeps.tgz sweeps && rm -rf sweeps && tar czf logs.tgz *.log && rm -f *.log; ls)
