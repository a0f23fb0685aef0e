# A new held-out script, examples/heldout/cascade_serve.py (two models a request: retrieval, an
# in-place mask and a topk on its output, then a ranker on the GPU-resident candidates), through
# profile --apply; and log_only_serve.py again: a close win now reported by the mean of both
# rounds, and a refused batching said once per site. The tmp folders' logs tarred back.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
python3 examples/heldout/cascade_serve.py --threads 4 --queries 3000 > $OUT/cascade_plain.txt 2>&1
T=${T:-480} gpu_test heldout_cascade tests/test_heldout_gpu.py -k "cascade or log_only" --basetemp=/tmp/bt
cd /tmp/bt && find . -name 'apply.json' -o -name '*.log' | head -40 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log
