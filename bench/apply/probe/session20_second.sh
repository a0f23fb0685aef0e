# One H200, the twentieth session's hook changes on the GPU: the steady copy path (_autoapply/steady.py)
# through the thread-graph GPU tests and a same-machine A/B of the DLRM and plain scripts against the
# tree before it (OLD_TREE, a `git archive 25504a3` carried in out/old), graphs bounded per argument
# family (optional features), and the new held-out method_api_serve.py through profile --apply.
# Before the call, here: rm -rf out/old && mkdir -p out/old && git archive 25504a3 | tar -x -C out/old
# (then carry ["out/old", ".whl", ".gpu-libs"]); OUT=$OUT bash bench/apply/probe/session20_second.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=200
T=170 gpu_test apply_gpu tests/test_apply_gpu.py
T=120 gpu_test batching_gpu tests/test_batching_gpu.py
if [ -d out/old ]; then CASES="plain4 dlrm4 kjt1" timeout 260 bash bench/apply/hook_ab.sh out/old 2 > $OUT/hook_ab.txt 2>&1; tail -8 $OUT/hook_ab.txt; fi
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
STOP_AT=560
T=200 gpu_test heldout_method tests/test_heldout_gpu.py -k "method_api or optional_features" --basetemp=/tmp/bt2
rm -f $OUT/setup.log
# (at most 8 files come back: the logs in one archive)
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
