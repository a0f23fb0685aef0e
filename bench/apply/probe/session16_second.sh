# (1) The sequence model captured as it is and with enable_nested_tensor=False (nested_capture.py):
# is the hint the hook now gives true? (2) seqrec_serve.py through profile --apply again: a capture
# that needs the host now makes its module eager at once, and the reason names PyTorch's line.
# (3) sparse_amp_train.py profiled as it is (the sqlite kept): how much of its "launch-bound"
# host wait follows a long silent stretch of the launching thread (silent_stretch.py).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
python3 bench/apply/probe/nested_capture.py > $OUT/nested_capture.jsonl 2> $OUT/nested_capture.err; cat $OUT/nested_capture.jsonl
timeout 200 recsys-doctor profile --json --out /tmp/p_sa examples/heldout/sparse_amp_train.py -- --epochs 1 > $OUT/sparse_amp_profile.json 2> $OUT/sparse_amp_profile.err
echo "profile rc=$? [${SECONDS}s]"
db=$(ls /tmp/p_sa/*.sqlite 2>/dev/null | head -1)
[ -n "$db" ] && python3 bench/apply/probe/silent_stretch.py "$db" > $OUT/sparse_amp_silent.txt 2>&1 && cat $OUT/sparse_amp_silent.txt && gzip -c "$db" > $OUT/sparse_amp.sqlite.gz && ls -la $OUT/sparse_amp.sqlite.gz
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 575 - SECONDS )) gpu_test heldout_seqrec tests/test_heldout_gpu.py -k seqrec --basetemp=/tmp/bt
cd /tmp && find bt -name 'apply.json' -o -name '*.log' 2>/dev/null | head -60 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log
