# The fourteenth session's fifth and sixth GPU calls. A script calling model.forward(...) itself
# (its submodules' calls taken over one by one) and a model that is a plain function (the hook sees
# no model call; the note of profile --apply from those stats): the test of the sixth call (in the
# fifth, its first version expected no model call for model.forward(...) and failed), with the
# session's other new hook tests. Then two held-out scripts through profile --apply on the
# session's code (the data-dependent branch, the DCN frame server), rows into $OUT/heldout_rows.json.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=90 gpu_test forward_direct tests/test_autoapply_gpu.py -k "forward_called_directly or host_random or one_request"
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=$(( 470 - SECONDS )) gpu_test heldout_two tests/test_heldout_gpu.py -k "fresh_boost or dcn_frame"
rm -f $OUT/setup.log
