# Eleventh session, last call (H200): the refresh fix with the record brought up to date after
# the retire: per-wave sums of 14 hooked runs against the unhooked one, the refresh GPU test,
# the refresh script through profile --apply, the hook's GPU tests.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/waves.jsonl
A="--threads 4 --queries 1200 --refresh-every 150"
S=examples/heldout/model_refresh_serve.py
python3 bench/apply/hooked_run.py $J ref 0 $S $A >/dev/null 2>>$OUT/err.txt
for i in 1 2 3 4 5 6; do python3 bench/apply/hooked_run.py $J g2 2 $S $A >/dev/null 2>>$OUT/err.txt; done
for i in 1 2 3; do RECSYS_DOCTOR_THREAD_GRAPHS=0 python3 bench/apply/hooked_run.py $J g2_notg 2 $S $A >/dev/null 2>>$OUT/err.txt; done
for i in 1 2 3; do python3 bench/apply/hooked_run.py $J g1 1 $S $A >/dev/null 2>>$OUT/err.txt; done
for i in 1 2; do RD_BATCHING=1 python3 bench/apply/hooked_run.py $J b2 2 $S $A >/dev/null 2>>$OUT/err.txt; done
python3 - $J <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = rows[0]["wave_sums"]
for r in rows:
    bad = [i for i, (a, b) in enumerate(zip(r["wave_sums"], ref)) if abs(a - b) > 1e-6 * abs(b)]
    h = r.get("hook") or {}
    print(r["label"], r.get("qps"), "bad waves", bad, "checksum", r["checksum"], "replays", h.get("replays"), h.get("served_calls"))
PY
t() { T=${T:-200} gpu_test "$@"; }
t refresh tests/test_autoapply_refresh_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=150 t heldout_refresh tests/test_heldout_gpu.py -k model_refresh
T=100 t autoapply tests/test_autoapply_gpu.py
