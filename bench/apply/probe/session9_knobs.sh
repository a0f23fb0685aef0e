# Ninth session, third call: which CUDA calls of a hooked query give the GIL up
# (bench/apply/probe/gil_release.py --cuda), then the interpreter's switch interval under the
# hook (RECSYS_DOCTOR_SWITCH_INTERVAL_MS, an experiment's knob) against the default, alternated.
# (RECSYS_DOCTOR_SWITCH_INTERVAL_MS was a working-tree knob of this experiment, read by the hook's activate(); not kept: no gain, bench/apply/results/pageable_fast_h100/switch_interval/)
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
python3 bench/apply/probe/gil_release.py --cuda > $OUT/gil_release_cuda.jsonl 2>&1; cat $OUT/gil_release_cuda.jsonl
CASES="${CASES:-plain4 dlrm2 mmoe8}" KNOBS="- RECSYS_DOCTOR_SWITCH_INTERVAL_MS=0.2" bash bench/apply/knob_ab.sh 2 2>&1 | grep -v "^setup\|^NVIDIA"
echo "total $(( $(date +%s) - t0 )) s"
