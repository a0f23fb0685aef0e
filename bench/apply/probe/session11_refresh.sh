# Eleventh session, second call (H200): the model-refresh fix (_autoapply/modstate.py) on the
# GPU: its GPU test, the hook's and apply's GPU tests, the two new held-out scripts through
# profile --apply, and the refresh script under fixed plans (bench/apply/ab_cases.sh).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
cat $OUT/env.json
t() { T=${T:-200} gpu_test "$@"; }
t test_autoapply_refresh_gpu tests/test_autoapply_refresh_gpu.py
J=$OUT/refresh_ab.jsonl
for c in ref0 ref1 ref2 refb2; do
  timeout 120 bash -c ". bench/apply/ab_cases.sh; ab_case $J fixed $c" 2>>$OUT/cases.err | cut -c1-200
done
T=150 t test_autoapply_apply_gpu tests/test_autoapply_gpu.py tests/test_apply_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=230 t test_heldout_gpu_new tests/test_heldout_gpu.py -k "model_refresh or jagged"
