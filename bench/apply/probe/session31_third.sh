# One H200, session 31, third call (issue 24): callers staging their own queries only while fewer than N
# requests are queued or running (RECSYS_DOCTOR_STAGE_BELOW, an experiment of the working tree): N = 8, 16,
# always (100000), against HEAD (old_tree on PYTHONPATH); the batched call, 3 rounds, order rotating.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
pkg=$(realpath old_tree).pkg; rm -rf $pkg; mkdir -p $pkg; cp -r old_tree/recsys_doctor $pkg/
for d in analyzers runtime reports; do cp -r old_tree/$d $pkg/recsys_doctor/$d; done
one() {  # label round
  case $1 in
    old) export PYTHONPATH=$pkg; unset RECSYS_DOCTOR_STAGE_BELOW;;
    s8) unset PYTHONPATH; export RECSYS_DOCTOR_STAGE_BELOW=8;;
    s16) unset PYTHONPATH; export RECSYS_DOCTOR_STAGE_BELOW=16;;
    all) unset PYTHONPATH; export RECSYS_DOCTOR_STAGE_BELOW=100000;;
  esac
  OUT=$OUT/ab NAME=$1_r$2.json QS=1,4,8,16,32,64 DUR=1 CONFIG_TIMEOUT=60 CONFIGS=runtime_batched_call \
    timeout 60 python3 bench/serving/serving_sweep.py > /dev/null 2>&1; echo -n "$1 r$2 [${SECONDS}s] "
}
for r in 1 2 3; do
  case $r in 1) o="old s8 s16 all";; 2) o="all s16 s8 old";; 3) o="s16 old all s8";; esac
  for l in $o; do one $l $r; done
done
unset PYTHONPATH RECSYS_DOCTOR_STAGE_BELOW; echo
OUT=$OUT/ab NAME=hand.json QS=1,4,8,16,32,64 DUR=1 CONFIGS=handroll_prepacked timeout 60 python3 bench/serving/serving_sweep.py > /dev/null 2>&1
for l in old s8 s16 all; do echo "== $l"; python3 bench/serving/sweep_table.py $OUT/ab/${l}_r*.json | tail -1; done
python3 bench/serving/sweep_table.py $OUT/ab/hand.json
(cd $OUT && tar czf ab.tgz ab && rm -rf ab)
echo "done [${SECONDS}s]"
