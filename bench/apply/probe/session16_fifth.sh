# The new held-out event_timed_serve.py (CUDA-event timing around the model call, a device-wide
# torch.cuda.synchronize() a request, inputs pinned per request, 2-D weighted EmbeddingBags,
# threads on a shared counter) as it is and through profile --apply.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
python3 examples/heldout/event_timed_serve.py --threads 4 --queries 3000 > $OUT/event_plain.txt 2>&1; tail -1 $OUT/event_plain.txt
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 560 - SECONDS )) gpu_test heldout_event tests/test_heldout_gpu.py -k event_timed --basetemp=/tmp/bt
cd /tmp && find bt -name 'apply.json' -o -name '*.log' 2>/dev/null | head -60 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log
