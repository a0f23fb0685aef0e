# Eleventh session: which refresh of examples/heldout/model_refresh_serve.py a hooked run gets
# wrong (per-wave sums against the unhooked run), with and without the threads' own graphs.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/waves.jsonl
A="--threads 4 --queries 1200 --refresh-every 150"
python3 bench/apply/hooked_run.py $J ref 0 examples/heldout/model_refresh_serve.py $A >/dev/null 2>>$OUT/err.txt
for i in 1 2 3 4; do python3 bench/apply/hooked_run.py $J g2 2 examples/heldout/model_refresh_serve.py $A >/dev/null 2>>$OUT/err.txt; done
for i in 1 2 3; do RECSYS_DOCTOR_THREAD_GRAPHS=0 python3 bench/apply/hooked_run.py $J g2_notg 2 examples/heldout/model_refresh_serve.py $A >/dev/null 2>>$OUT/err.txt; done
for i in 1 2 3; do python3 bench/apply/hooked_run.py $J g1 1 examples/heldout/model_refresh_serve.py $A >/dev/null 2>>$OUT/err.txt; done
python3 - $J <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = rows[0]["wave_sums"]
for r in rows:
    bad = [i for i, (a, b) in enumerate(zip(r["wave_sums"], ref)) if abs(a - b) > 1e-6 * abs(b)]
    print(r["label"], r.get("qps"), "bad waves", bad, [round(r["wave_sums"][i] - ref[i], 4) for i in bad], (r.get("hook") or {}).get("thread_replays"))
PY
