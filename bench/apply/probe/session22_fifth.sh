# One H200: the processes a profiled program starts exit through Python on SIGTERM
# (recsys_doctor/capture/term_exit.py): proc_pool_serve.py (a spawn Pool its `with` block ends with
# terminate()) through `recsys-doctor profile`, its trace counted per process (nsys_by_pid.py;
# before the change its workers left 0 kernels), then through profile --apply (test_heldout_gpu.py),
# and the CPU tests of the change on the machine's Python 3.12.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
P=bench/apply/probe
timeout 120 python3 -m recsys_doctor profile examples/heldout/proc_pool_serve.py --out /tmp/pp \
  -- --procs 4 --queries 3000 > $OUT/profile.txt 2>&1; echo "profile rc $?: $(head -3 $OUT/profile.txt | cut -c1-200)"
python3 $P/nsys_by_pid.py /tmp/pp/trace.sqlite profiled | tee $OUT/by_pid.jsonl | cut -c1-600
cp /tmp/pp/profile.json $OUT/profile.json 2>/dev/null
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/test_term_exit.py > $OUT/term_exit.log 2>&1; echo "term_exit: $(tail -1 $OUT/term_exit.log)"
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
STOP_AT=150 T=190 gpu_test heldout_apply tests/test_heldout_gpu.py -k proc_pool --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
