# One H200, after the fixes of the first probe (_autoapply/trainers.py, jit tracing, torch.export's
# training flag, plain output leaves, batching's watch for writes into arguments): the learner's GPU
# tests and the artefact scripts under the hook with fixed plans (bench/apply/hooked_run.py).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=300
T=200 gpu_test trainers_gpu tests/test_autoapply_trainers_gpu.py
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; E=examples/heldout
run() { [ "$SECONDS" -lt 500 ] || return 0; timeout 100 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-200; }
for s in "generative_decode_serve.py --threads 4 --queries 600" "exported_ranker_serve.py --threads 4 --queries 3000" \
         "exported_ranker_serve.py --threads 4 --queries 3000 --export trace" "optional_features_serve.py --threads 4 --queries 3000"; do
  run ref 0 $E/$s; run g2 2 $E/$s; RD_BATCHING=1 run g2b 2 $E/$s
done
run ref 0 $E/kjt_ranker_serve.py --threads 4 --queries 3000; run g1 1 $E/kjt_ranker_serve.py --threads 4 --queries 3000
grep -B2 -A12 "Traceback" $J.log | tail -c 4000 > $OUT/tracebacks.txt
rm -f $OUT/setup.log
