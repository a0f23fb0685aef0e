#!/usr/bin/env bash
# Issue 24's committed sweep: PART=all (every configuration, one run, ~5 min on the H100), or
# PART=a / PART=b, half of them each (the hand-roll runs in both, so each half has its own anchor).
# usage (GPU machine, repository root, .whl and .gpu-libs carried): PART=a bash bench/serving/probe/final_sweep.sh
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
case ${PART:-a} in
  a) C=eager,handroll_prepacked,handroll_prepacked_branched,runtime_call,runtime_request,runtime_batched_call;;
  all) C=eager,handroll_prepacked,handroll_prepacked_branched,runtime_call,runtime_request,runtime_batched_call,runtime_batched_submit,runtime_batched_async,runtime_batched_call_g8,runtime_batched_call_si5,handroll_prepacked_si0.5,runtime_batched_call_dr4,runtime_batched_call_b1,runtime_batched_call_dr1,runtime_batched_async_dr1;;
  b) C=handroll_prepacked,runtime_batched_submit,runtime_batched_async,runtime_batched_call_g8,runtime_batched_call_si5,handroll_prepacked_si0.5,runtime_batched_call_dr4,runtime_batched_call_b1,runtime_batched_call_dr1,runtime_batched_async_dr1;;
esac
nvidia-smi --query-gpu=serial,uuid --format=csv,noheader > "$OUT/gpu_id_${PART:-a}.txt"
OUT=$OUT NAME=sweep_${PART:-a}.json CONFIGS=$C DUR=1.5 timeout 560 python3 bench/serving/serving_sweep.py > "$OUT/sweep_${PART:-a}.log" 2>&1
echo "rc=$?"; grep -E "^# |errors\": \[\"" "$OUT/sweep_${PART:-a}.log" | cut -c1-200
rm -f "$OUT"/sweep_*.png
