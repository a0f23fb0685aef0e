#!/bin/sh
# Capture every scenario of bench/pathologies/pathologies.py under Nsight Systems on the GPU machine
# and leave gzipped SQLite exports in $OUT (see /work/shared/GPU.md for the nsys set-up).
# Usage (repo root on the GPU machine): OUT=dir sh bench/pathologies/pathologies_h100.sh [DIR]
# (DIR: where pathologies.py is, default bench/pathologies)
DIR=${1:-bench/pathologies}
mkdir -p /tmp/dw && for f in .gpu-libs/*.deb; do dpkg -x "$f" /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export PATH=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64:$PATH
LOG=$OUT/pathologies.log
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nsys --version
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'; } > "$LOG" 2>&1
for s in ${SCENARIOS:-large_kernels sync_per_query pingpong threads8_one_stream graphs_in_use}; do
  echo "== $s" >> "$LOG"
  t0=$(date +%s)
  timeout 100 nsys profile -t cuda,nvtx,osrt --sample=none --cpuctxsw=none -o /tmp/$s \
      python3 "$DIR/pathologies.py" "$s" >> "$LOG" 2>&1 || echo "profile of $s failed" >> "$LOG"
  timeout 60 nsys export --type sqlite -o /tmp/$s.sqlite /tmp/$s.nsys-rep >> "$LOG" 2>&1 || echo "export of $s failed" >> "$LOG"
  [ -f /tmp/$s.sqlite ] && gzip -9c /tmp/$s.sqlite > "$OUT/$s.sqlite.gz"
  echo "$s took $(( $(date +%s) - t0 )) s; $(ls -l /tmp/$s.sqlite 2>/dev/null | awk '{print $5}') bytes" >> "$LOG"
done
ls -l "$OUT" >> "$LOG"
cat "$LOG"
