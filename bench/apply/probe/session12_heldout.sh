# Twelfth session, fourth GPU call (H200): the two held-out scripts never run through
# profile --apply (feature pipeline, top-k) and two run before (DCN frame, AMP ranker), through
# tests/test_heldout_gpu.py (rows in $OUT/heldout_rows.json); then the top-k script at 20,000
# requests unhooked and at 2 groups, alternating: is its loss at 3,000 requests the hook's
# start (15 captures, each stalling every thread) or its steady state?
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
timeout 380 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_heldout_gpu.py -k "feature_pipeline or topk or dcn or amp" > $OUT/heldout.log 2>&1
echo "heldout: $(tail -1 $OUT/heldout.log) [${SECONDS}s]"
J=$OUT/topk_long.jsonl
run() { [ $SECONDS -lt 530 ] || return 0; timeout 60 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-120; }
for i in 1 2; do run l$i topk0l; run l$i topk2l; done
echo "done [${SECONDS}s]"
