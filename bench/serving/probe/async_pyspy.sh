#!/usr/bin/env bash
# Where 64 asyncio coroutines' time goes (issue 24's async64): py-spy of the batched infer path, attached
# after warm-up: --gil (who holds the GIL) and --idle (every thread, waiting too), raw folded stacks.
# usage (GPU machine, repository root, .whl carried): bash bench/serving/probe/async_pyspy.sh [CONFIG] [Q]
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh > /dev/null
C=${1:-runtime_batched_async}; Q=${2:-64}
python3 bench/serving/serving_sweep.py --one $C $Q 12 > "$OUT/run_$C.log" 2>&1 &
P=$!; sleep 8
py-spy record --gil --threads -r 250 -d 3 -f raw -p $P -o "$OUT/pyspy_gil_$C.txt" > /dev/null 2>&1
py-spy record --idle --threads -r 250 -d 2 -f raw -p $P -o "$OUT/pyspy_idle_$C.txt" > /dev/null 2>&1
wait $P; grep ROW "$OUT/run_$C.log" | cut -c1-200; gzip -f "$OUT"/pyspy_*.txt
