#!/usr/bin/env bash
# One device call that checks main on the GPU machine: set-up (wheels in .whl, libdw in
# .gpu-libs for nsys), every GPU test, profile --host-sample on the wide&deep workload, and a
# short serving sweep of the runtime's request path. Logs and results under $OUT.
# usage (carry .whl and .gpu-libs): bash bench/gpu_check.sh
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
if [ -d .gpu-libs ]; then
  mkdir -p /tmp/dw && for f in .gpu-libs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
for d in /opt/nvidia/nsight-compute/*/host/target-linux-x64; do [ -x "$d/nsys" ] && export PATH=$d:$PATH; done
python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$OUT/setup.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/setup.log" 2>&1 || { echo "install failed"; tail -5 "$OUT/setup.log"; }
python3 - > "$OUT/env.json" <<'PY'
import json, platform, subprocess, torch
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().split(", ")
print(json.dumps({"gpu": smi[0], "driver": smi[-1], "cuda": torch.version.cuda, "torch": torch.__version__,
                  "python": platform.python_version()}))
PY
cat "$OUT/env.json"; echo "setup $(( $(date +%s) - t0 )) s"
s=$(date +%s)
timeout ${TESTS_TIMEOUT:-330} python3 -m pytest -q -m gpu tests -p no:cacheprovider -rs > "$OUT/gpu_tests_all.log" 2>&1
echo "gpu tests rc=$? $(( $(date +%s) - s )) s"; grep -E "passed|failed|FAILED|Error" "$OUT/gpu_tests_all.log" | tail -12
s=$(date +%s)
timeout 150 recsys-doctor profile examples/wdl_workload.py --threads 4 --duration 2 --host-sample --no-baseline \
  --out /tmp/hs > "$OUT/host_sample.txt" 2>&1
echo "profile --host-sample rc=$? $(( $(date +%s) - s )) s"; grep -i -A14 "host\|GIL" "$OUT/host_sample.txt" | head -40
s=$(date +%s)
OUT=$OUT NAME=request_check.json QS=8 CONFIGS=handroll_prepacked,runtime_request DUR=1 timeout 120 \
  python3 bench/serving_sweep.py > "$OUT/request_check.log" 2>&1
echo "sweep runtime_request rc=$? $(( $(date +%s) - s )) s"; grep -v "^#" "$OUT/request_check.log" | tail -6
