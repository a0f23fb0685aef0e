# The held-out script that prints no throughput (examples/heldout/log_only_serve.py) through
# profile --apply alone (the first call ran out of time on it after short_threads): the test
# with its tmp folder kept, the tool's apply.json, program logs and stdout tarred back.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=${T:-540} gpu_test heldout_log_only tests/test_heldout_gpu.py -k log_only --basetemp=/tmp/bt -s
cd /tmp/bt && find . -name 'apply.json' -o -name '*.log' -o -name 'notes*' | head -40 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; cat /tmp/list | head
