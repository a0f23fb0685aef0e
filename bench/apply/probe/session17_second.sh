# The new held-out serving scripts through profile --apply on the H200: the GRU4Rec session
# recommender (CPU lengths into pack_padded_sequence: must never replay one request's lengths for
# another's) and the HTTP JSON service (a handler thread per client connection).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=300
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=260 gpu_test heldout_gru4rec tests/test_heldout_gpu.py -k gru4rec --basetemp=/tmp/bt1
T=260 gpu_test heldout_http tests/test_heldout_gpu.py -k http_json --basetemp=/tmp/bt2
for d in bt1 bt2; do find /tmp/$d -name "*.json" -size -400k | tar czf $OUT/$d.tgz -T - 2>/dev/null; done
rm -f $OUT/setup.log
