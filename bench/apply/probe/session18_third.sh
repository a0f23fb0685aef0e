# Two GPUs (nvidia-h200-x2): a process serving a replica per GPU (examples/heldout/multi_gpu_serve.py)
# as it is and under the hook's fixed plans, on the hook as it was (streams and groups on one device).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
nvidia-smi -L
python3 examples/heldout/multi_gpu_serve.py --threads 4 --queries 2000
T=240 gpu_test multigpu tests/test_autoapply_multigpu_gpu.py --basetemp=/tmp/bt1 -x
grep -E "^E |Error|error" $OUT/multigpu.log | head -30
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
find /tmp/bt1 -name "*.log" -size -400k | tar czf $OUT/bt1logs.tgz -T - 2>/dev/null
rm -f $OUT/setup.log
