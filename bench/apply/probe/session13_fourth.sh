# The fourth GPU call of session 13: with placement at the first model call the copy methods
# were patched only at the first thread's placement, so the other threads' first queries' copies
# went uncounted (tests/test_apply_gpu.py counted 35 of 156 at one line); now patched when the
# first thread is marked. test_apply_gpu.py again, then DLRM and MMoE of the suite through
# profile --apply (rows to $OUT/suite_rows.json; the ≥8x check fails these, known, issue 25).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=90 gpu_test apply_gpu tests/test_apply_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/suite_rows.json
T=$(( 500 - SECONDS )) gpu_test suite_gpu tests/test_scripts_suite_gpu.py -k "dlrm or mmoe"
grep -E "^E  " $OUT/suite_gpu.log | cut -c1-300 | head -20
