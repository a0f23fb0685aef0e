# One H200: are optional_features' and kjt's losses under fixed plans warm-up or steady state?
# Longer runs (12,000 and 8,000 queries) of each as it is and hooked, rounds alternating; optional
# features also without thread graphs; kjt also on one side stream with nothing of ours.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; E=examples/heldout
run() { timeout 120 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-300; }
S="$E/optional_features_serve.py --threads 4 --queries 12000"
for r in 1 2; do run ref 0 $S; run g2 2 $S; RECSYS_DOCTOR_THREAD_GRAPHS=0 run g2_notg 2 $S; done
K="$E/kjt_ranker_serve.py --threads 8 --queries 8000"
for r in 1 2; do run ref 0 $K; RD_NO_GRAPHS=1 run g1_nograph 1 $K
  echo "shared $(timeout 60 python3 bench/apply/probe/stream_only.py shared $K 2>&1 | tail -1 | cut -c1-120)"; done
(cd $OUT && tar czf logs.tgz hooked.jsonl.log && rm -f hooked.jsonl.log setup.log; ls)
