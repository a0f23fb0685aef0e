# One H200: the learner-thread fix (_autoapply/trainers.py) - its GPU tests (in-process waves with
# and without it, the online-learning script under 1 and 2 groups) - and the four new held-out
# scripts plus the two of the last session, each unhooked, under 2 graphed groups and under 2
# groups batching (bench/apply/hooked_run.py: checksums and the hook's counters); the
# online-learning script also with RECSYS_DOCTOR_TRAINERS=0 (the learner kept in its group).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=470
T=220 gpu_test trainers_gpu tests/test_autoapply_trainers_gpu.py
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; E=examples/heldout
run() { [ "$SECONDS" -lt 520 ] || return 0; timeout 100 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-230; }
OL="$E/online_learning_serve.py --threads 4 --queries 1200 --waves 6 --train-steps 10"
run ref 0 $OL; RECSYS_DOCTOR_TRAINERS=0 run nofix 2 $OL; run fix 2 $OL
RECSYS_DOCTOR_TRAINERS=0 run nofix4 4 $OL; run fix4 4 $OL
for s in "generative_decode_serve.py --threads 4 --queries 600" "exported_ranker_serve.py --threads 4 --queries 3000" \
         "optional_features_serve.py --threads 4 --queries 3000" "exported_ranker_serve.py --threads 4 --queries 3000 --export trace" \
         "exported_ranker_serve.py --threads 4 --queries 3000 --export fx" \
         "kjt_ranker_serve.py --threads 4 --queries 3000" "triton_backend_serve.py --threads 4 --queries 3000"; do
  run ref 0 $E/$s; run g2 2 $E/$s; RD_BATCHING=1 run g2b 2 $E/$s
done
tail -c 3000 $J.log > $OUT/hooked_log_tail.txt
rm -f $OUT/setup.log
