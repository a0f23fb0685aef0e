# Eleventh session, first call (H200): the GPU tests owed by a267cc7, then the two new
# held-out scripts (model refresh, jagged DLRM) unhooked and hooked on this tree.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
cat $OUT/env.json
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_autoapply_gpu.py > $OUT/test_autoapply_gpu.log 2>&1; tail -1 $OUT/test_autoapply_gpu.log
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_apply_gpu.py > $OUT/test_apply_gpu.log 2>&1; tail -1 $OUT/test_apply_gpu.log
J=$OUT/heldout_ab.jsonl
for c in ${CASES:-ref0 ref1 ref2 refb2 jag0 jag2 jagb2}; do
  timeout 150 bash -c ". bench/apply/ab_cases.sh; ab_case $J first $c" 2>>$OUT/cases.err
  tail -1 $J | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); print(r['label'], r['script'], r['groups'], r.get('batching'), r.get('qps'), r.get('checksum'), r.get('hook'))"
done
