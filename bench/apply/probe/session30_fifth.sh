# One H200, session 30, fifth call: serve(batching=True) now holds a 0.2 ms GIL switch interval by default
# (runtime/_serve_batching.py). (1) the batching GPU tests on it; (2) serving_sweep.py, Q = 1..128, 2 rounds in
# alternating order: the batched call and coroutines at the new default and at Python's 5 ms (_si5, the code
# before), the batched call at 0.5 ms, the hand-roll; (3) the hook's experiment again (knob_ab.sh, DLRM g4 and
# MMoE g8 at 5 ms and 1 ms, 3 rounds), where MMoE lost in the fourth call.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
T=90 gpu_test batching_gpu tests/test_batching_gpu.py
a=runtime_batched_call,runtime_batched_call_si5,runtime_batched_call_si0.5,runtime_batched_async,runtime_batched_async_si5,handroll_prepacked
b=handroll_prepacked,runtime_batched_async_si5,runtime_batched_async,runtime_batched_call_si0.5,runtime_batched_call_si5,runtime_batched_call
for r in 1 2; do
  c=$a; [ $r = 2 ] && c=$b
  OUT=$OUT/sweeps NAME=round$r.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=100 CONFIGS=$c \
    timeout 200 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | tr '\n' ' '; echo
done
python3 - <<'PY'
import json, os, glob, collections
by = collections.defaultdict(list)
for f in sorted(glob.glob(os.environ["OUT"] + "/sweeps/round*.json")):
    rows = json.load(open(f)); rows = rows if isinstance(rows, list) else rows["rows"]
    for r in rows:
        if r.get("qps"): by[(r["config"], r["Q"])].append(round(r["qps"]))
        if r.get("errors") or (r.get("max_abs_err") or 0) > 1e-5: print("BAD", f, r["config"], r["Q"], r.get("max_abs_err"), r.get("errors"))
qs = sorted({k[1] for k in by})
for c in dict.fromkeys(k[0] for k in by):
    print(f"{c:28s} " + " ".join(f"{sum(v)/len(v):7.0f}" if (v := by.get((c, q))) else "      -" for q in qs))
PY
echo "sweeps done [${SECONDS}s]"
CASES="dlrm4 mmoe8" KNOBS="- RECSYS_DOCTOR_SWITCH_INTERVAL_MS=1" AB_PIN="taskset -c 0-7" \
  timeout $((570 - SECONDS)) bash bench/apply/knob_ab.sh 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-100 > $OUT/knob_ab.txt
python3 - <<'PY'
import json, os, collections
by = collections.defaultdict(list)
for l in open(os.environ["OUT"] + "/knob_ab.jsonl"):
    r = json.loads(l)
    by[(r["script"], r["label"])].append((r.get("qps"), r.get("checksum")))
for k, v in sorted(by.items()):
    q = [x[0] for x in v if x[0]]
    print(k[0][:14], k[1][-6:], "mean", round(sum(q) / max(1, len(q)), 1), [x[0] for x in v], len({x[1] for x in v}), "checksum(s)")
PY
echo "done [${SECONDS}s]"
(cd $OUT && tar czf sweeps.tgz sweeps && rm -rf sweeps && tar czf logs.tgz $(ls | grep -E '\.log$') && rm -f $(ls | grep -E '\.log$'); ls)
