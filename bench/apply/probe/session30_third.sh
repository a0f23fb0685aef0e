# One H200, session 30, third call: issue 24's serving sweep on the current runtime, Q = 1..128 with
# default settings (no hang, every request checked against eager): the hand-roll, request() (8 groups),
# the batched call (4 groups; 8 groups; a 0.2 ms switch interval) and 64-128 asyncio coroutines.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
OUT=$OUT NAME=serving_sweep_h200.json QS=1,4,8,16,32,64,128 DUR=1 CONFIG_TIMEOUT=120 \
  CONFIGS=handroll_prepacked,runtime_request,runtime_batched_call,runtime_batched_call_g8,runtime_batched_call_si,runtime_batched_async \
  timeout 540 python3 bench/serving/serving_sweep.py 2>&1 | grep '^#' | cut -c1-200
python3 - <<'PY'
import json, os, collections
rows = json.load(open(os.environ["OUT"] + "/serving_sweep_h200.json"))
rows = rows if isinstance(rows, list) else rows["rows"]
qs = sorted({r["Q"] for r in rows if r.get("Q")})
by = {(r["config"], r["Q"]): r for r in rows if r.get("Q")}
for c in dict.fromkeys(r["config"] for r in rows):
    print(f"{c:28s} " + " ".join(f"{by[(c, q)]['qps']:8.0f}" if (c, q) in by and by[(c, q)].get("qps") else "       -" for q in qs))
for r in rows:
    if r.get("errors") or (r.get("max_abs_err") or 0) > 1e-5: print("BAD", r["config"], r["Q"], r.get("max_abs_err"), r.get("errors"))
PY
echo "done [${SECONDS}s]"
