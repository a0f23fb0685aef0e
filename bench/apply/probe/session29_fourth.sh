# One H200, session 29, fourth call: issue 25's scripts suite through profile --apply on the current
# hook (2f09cc8's code, unchanged since), first half: deepfm, two-tower, candidates (their rows were 3799ac2's).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
SETUP_DONE=1 bash bench/gpu/suite_part.sh "deepfm or two_tower or candidates"
