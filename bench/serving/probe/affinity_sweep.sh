# Tenth session: does pinning the process to a few cores change the host bound? The hand-roll
# and the batched call at Q = 8, 32, 64 (1 s a point), the whole process under
# `taskset -c MASK` (all: no mask), masks in the order given, each configuration in its own
# process (bench/serving/serving_sweep.py). Rows in $OUT/affinity_<mask>_<round>/.
# MASKS="all 0-1 0-3 all" CONFIGS=... QS=... bash bench/serving/probe/affinity_sweep.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
r=0
for m in ${MASKS:-all 0-1 0-3 all}; do
  r=$((r + 1))
  d=$OUT/affinity_${m}_$r; mkdir -p "$d"
  pre=""; [ "$m" != all ] && pre="taskset -c $m"
  OUT=$d QS=${QS:-8,32,64} CONFIGS=${CONFIGS:-handroll_prepacked,runtime_batched_call} DUR=${DUR:-1} \
    timeout 300 $pre python3 bench/serving/serving_sweep.py > "$d/log.txt" 2>&1
  echo "mask $m rc $?"; grep '"qps"' "$d/log.txt" | python3 -c "
import sys, json
for l in sys.stdin:
    l = l[l.index('{'):]
    r = json.loads(l); print(' ', r['config'], r['Q'], r.get('qps'), r.get('p99_ms'), r.get('max_abs_err'))"
done
