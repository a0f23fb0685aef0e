# For the next session's first GPU call: does the hook keep a two-stage pipeline's outputs
# (examples/heldout/feature_pipeline_serve.py: a feature thread hands GPU tensors to model
# threads over a queue, nothing synchronizing), with threads placed at their start (the
# default) and at their first model call (RECSYS_DOCTOR_PLACE=first-call, which leaves the
# feature thread on PyTorch's default stream)? Then the cost of first-call placement on the
# keep-target script, the DLRM and MMoE scripts, alternating the two placements twice.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/pipeline_ab.jsonl
run() { timeout 120 bash -c ". bench/apply/ab_cases.sh; ab_case $J $1 $2" 2>>$OUT/cases.err | cut -c1-120; }
run r0 pipe0
for i in 1 2 3; do run r$i pipe2; run r$i pipe4; run r$i pipe2f; run r$i pipe4f; done
run t0 topk0; for i in 1 2; do run t$i topk2; done  # (old trees padded its top-k: wrong or a crash)
for i in 1 2; do for c in plain4 plain4f dlrm2 dlrm2f mmoe8 mmoe8f; do run ab$i $c; done; done
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_autoapply_gpu.py tests/test_autoapply_refresh_gpu.py tests/test_autoapply_argwrites_gpu.py tests/test_autoapply_pipeline_gpu.py > $OUT/hook_tests.log 2>&1; tail -1 $OUT/hook_tests.log
