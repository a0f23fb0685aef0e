# One H200: the new held-out offline_scoring_serve.py (a nightly batch-scoring job: DataLoader
# workers with pinned memory, one consumer thread, a partial last batch) as it is and under g1,
# then through profile --apply (test_heldout_gpu.py); and the planner's groups for a pool of
# single-threaded worker processes on a real trace (proc_pool, 4 workers: 1 group, not 4).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; S="examples/heldout/offline_scoring_serve.py --workers 2 --queries 2000"
run() { timeout 100 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-300; }
run ref 0 $S; run g1 1 $S
timeout 120 python3 -m recsys_doctor profile examples/heldout/proc_pool_serve.py --out /tmp/pp --json -- --procs 4 --queries 3000 > $OUT/pp_profile.json 2>$OUT/pp_profile.err
python3 -c "import json; d=json.load(open('$OUT/pp_profile.json')); p=d.get('plan') or d.get('advice', {}).get('plan'); print(p and p['stream_groups'])" 2>&1 | tail -1
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
STOP_AT=330 T=250 gpu_test heldout_apply tests/test_heldout_gpu.py -k "offline_scoring" --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$|\.err$') && rm -f $(ls | grep -E '\.log$|\.txt$|\.err$'); ls)
