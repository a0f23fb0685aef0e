# Sourced by the device-call scripts (gpu_session.sh, gpu_check.sh, batching_session.sh): the
# set-up every call on the GPU machine needs, from the repository root, with .whl (the wheels
# the machine lacks) and .gpu-libs (libdw for Nsight Systems, ../shared/GPU.md) carried.
# Sets OUT (default ./out), t0; writes $OUT/setup.log and $OUT/env.json.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
t0=$(date +%s)
# Nsight Systems from inside Nsight Compute, with libdw carried in .gpu-libs
if [ -d .gpu-libs ]; then
  mkdir -p /tmp/dw && for f in .gpu-libs/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
for d in /opt/nvidia/nsight-compute/*/host/target-linux-x64; do [ -x "$d/nsys" ] && export PATH=$d:$PATH; done
python3 -m pip install -q --no-index --no-deps .whl/*.whl > "$OUT/setup.log" 2>&1
python3 -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/setup.log" 2>&1 || { echo "install failed"; tail -5 "$OUT/setup.log"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# what every result of this call ran on (GPU, driver, CUDA, torch, Python)
python3 - > "$OUT/env.json" <<'PY'
import json, platform, subprocess, torch
smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                     capture_output=True, text=True).stdout.strip().split(", ")
print(json.dumps({"gpu": smi[0], "driver": smi[-1], "cuda": torch.version.cuda, "torch": torch.__version__,
                  "python": platform.python_version()}))
PY
echo "setup $(( $(date +%s) - t0 )) s"
# gpu_test NAME FILE... [pytest options]: one pytest run of GPU tests, its log in $OUT/NAME.log and
# its last line echoed with the call's seconds so far (T: its timeout, default 150 s; STOP_AT:
# the call's second past which it starts nothing, so the call returns within the device's limit)
gpu_test() {
  [ "$SECONDS" -lt "${STOP_AT:-100000}" ] || return 0
  local name=$1; shift
  timeout "${T:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider "$@" > "$OUT/$name.log" 2>&1
  echo "$name: $(tail -1 "$OUT/$name.log" | cut -c1-150) [${SECONDS}s]"
}
