# Eleventh session, third call (H200): blocking group streams + modstate on the GPU: the refresh
# test, the hook's and apply's GPU tests (each file alone), the refresh script through profile
# --apply, an old-tree/new-tree A/B of the keep-target script and the DLRM script, runtime and
# batching GPU tests. out/old: the tree before (git archive HEAD), carried.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
R=$PWD
t() { T=${T:-200} gpu_test "$@"; }
t refresh tests/test_autoapply_refresh_gpu.py
T=120 t autoapply tests/test_autoapply_gpu.py
T=60 t apply tests/test_apply_gpu.py
J=$OUT/ab.jsonl
ab() { for c in $2; do timeout 100 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $c" 2>>$OUT/cases.err | cut -c1-110; done; }
ab new "plain0 plain4 dlrm2"
(cd out/old && python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1)
ab old "plain4 dlrm2"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
ab new2 "plain4 dlrm2"
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=150 t heldout_refresh tests/test_heldout_gpu.py -k model_refresh
T=90 t runtime_batching tests/test_runtime_gpu.py tests/test_batching_gpu.py
