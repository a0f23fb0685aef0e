#!/usr/bin/env bash
# Issue 24, 8 clients: where the batched path's host time goes, and how the group count changes it.
# usage (GPU machine, repository root, .whl and .gpu-libs carried): bash bench/serving/probe/q8_probe.sh
# Writes under $OUT: the GPU test logs, q8_groups.json (+ log), gil_q8_g*.txt (who hands the GIL off,
# bench/apply/gil_waits.py over an nsys capture with OS-runtime call stacks) and advise_q8_g*.txt.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
for f in ${TESTS-test_batching_gpu test_runtime_gpu test_apply_gpu test_autoapply_gpu}; do
  timeout 200 python3 -m pytest -q -m gpu tests/$f.py -p no:cacheprovider > "$OUT/$f.log" 2>&1
  echo "$f: $(tail -n 1 "$OUT/$f.log")"
done
OUT=$OUT NAME=q8_groups.json QS=${QS:-4,8,16} DUR=1.5 \
  CONFIGS=${CONFIGS:-handroll_prepacked,runtime_batched_call_g1,runtime_batched_call_g2,runtime_batched_call,runtime_batched_call_g8} \
  timeout 300 python3 bench/serving/serving_sweep.py > "$OUT/q8_groups.log" 2>&1
grep -v "^#" "$OUT/q8_groups.log" | cut -c1-230
rm -f "$OUT"/q8_groups.png
for c in ${NSYS_CONFIGS-runtime_batched_call}; do
  nsys profile -t cuda,nvtx,osrt --sample=none --cpuctxsw=none --osrt-threshold=10000 --osrt-backtrace-threshold=10000 \
    --backtrace=dwarf -f true -o /tmp/$c python3 bench/serving/serving_sweep.py --one $c 8 1.5 > "$OUT/nsys_$c.log" 2>&1
  nsys export --type sqlite -f true -o /tmp/$c.sqlite /tmp/$c.nsys-rep > /dev/null 2>&1
  grep ROW "$OUT/nsys_$c.log" | cut -c1-200
  python3 bench/apply/gil_waits.py /tmp/$c.sqlite > "$OUT/gil_q8_$c.txt" 2>&1; head -25 "$OUT/gil_q8_$c.txt"
  recsys-doctor advise /tmp/$c.sqlite > "$OUT/advise_q8_$c.txt" 2>&1
  ls -la /tmp/$c.sqlite
done
