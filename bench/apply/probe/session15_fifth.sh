# A single-threaded server (examples/heldout/asyncio_inline_serve.py: coroutines on the main
# thread) through profile --apply after 26f0a7e: one model-calling thread, so one group offered.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=${T:-330} gpu_test heldout_asyncio tests/test_heldout_gpu.py -k asyncio_inline --basetemp=/tmp/bt
cd /tmp/bt && find . -name 'apply.json' | head -5 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log
