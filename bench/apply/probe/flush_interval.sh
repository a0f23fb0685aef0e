# One H200: what Nsight Systems keeps of worker processes a pool ends with SIGTERM
# (``with Pool() as pool:`` calls terminate()): proc_pool_serve.py under `nsys profile` with the
# flags of recsys_doctor/capture/nsys.py, --cuda-flush-interval 0 (nsys's default), 100 and 500 ms,
# against the same script whose pool closes and joins (pool_close.py: the workers exit on their own).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
NSYS=$(command -v nsys); P=bench/apply/probe
S="examples/heldout/proc_pool_serve.py --procs 4 --queries 3000"
one() {  # LABEL FLUSH_MS PROGRAM...
  local label=$1 fi=$2; shift 2
  timeout 150 $NSYS profile -t cuda,nvtx --sample=none --cpuctxsw=none --cuda-flush-interval=$fi \
    --force-overwrite=true -o /tmp/$label "$@" > $OUT/$label.log 2>&1
  echo "$label: $(grep '^{' $OUT/$label.log | tail -1 | cut -c1-160)"
  timeout 120 $NSYS export --type sqlite --force-overwrite true -o /tmp/$label.sqlite /tmp/$label.nsys-rep >> $OUT/$label.log 2>&1
  python3 $P/nsys_by_pid.py /tmp/$label.sqlite $label | tee -a $OUT/by_pid.jsonl | cut -c1-400
}
one closed_f0 0 python3 $P/pool_close.py $S
one term_f0 0 python3 $S
one term_f100 100 python3 $S
one term_f500 500 python3 $S

# then profile --apply on it, with the flush interval now in recsys_doctor/capture/nsys.py's flags
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
STOP_AT=280 T=190 gpu_test heldout_apply tests/test_heldout_gpu.py -k proc_pool --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
