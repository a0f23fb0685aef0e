# One H200: where kjt_ranker_serve.py's eager path loses (0.55-0.67x under the hook with every call
# eager, heldout6_h200): the script as it is, under 1 group (graphs on: every call eager for its
# KeyedJagged argument), 1 group without thread graphs (no slots), 1 group without CUDA graphs
# (placement alone); then both under nsys (CUDA API, OS runtime) with api_summary.py's counts.
# Then optional_features_serve.py under 2 groups with graphs bounded per argument family.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
H=bench/apply/hooked_run.py; J=$OUT/hooked.jsonl; E=examples/heldout
run() { timeout 100 python3 $H $J "$@" 2>&1 | tail -1 | cut -c1-220; }
K="$E/kjt_ranker_serve.py --threads 8 --queries 3000"
for r in 1 2; do
  run ref 0 $K; run g1 1 $K; RECSYS_DOCTOR_THREAD_GRAPHS=0 run g1_notg 1 $K; RD_NO_GRAPHS=1 run g1_nograph 1 $K
done
mkdir -p /tmp/dw && for f in .gpu-libs/*.deb; do dpkg -x $f /tmp/dw; done
export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH
export PATH=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64:$PATH
K1="$E/kjt_ranker_serve.py --threads 8 --queries 1000"
for c in "ref 0" "g1 1"; do
  set -- $c
  timeout 120 nsys profile -t cuda,osrt --sample=none --cpuctxsw=none -o /tmp/kjt_$1 -f true \
    python3 $H $OUT/nsys_runs.jsonl $1 $2 $K1 > /dev/null 2>&1
  nsys export --type sqlite -o /tmp/kjt_$1.sqlite /tmp/kjt_$1.nsys-rep > /dev/null 2>&1
  python3 bench/apply/probe/api_summary.py /tmp/kjt_$1.sqlite >> $OUT/api_summary.jsonl
  echo "nsys $1: $(tail -c 400 $OUT/api_summary.jsonl | cut -c1-300)"
done
gzip -c /tmp/kjt_g1.sqlite > $OUT/kjt_g1.sqlite.gz; gzip -c /tmp/kjt_ref.sqlite > $OUT/kjt_ref.sqlite.gz
S="$E/optional_features_serve.py --threads 4 --queries 3000"
run ref 0 $S; run g2 2 $S; run ref 0 $S; run g2 2 $S
STOP_AT=500
T=150 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
grep -B2 -A12 "Traceback" $J.log | tail -c 3000 > $OUT/tracebacks.txt
rm -f $OUT/setup.log
# (at most 8 files come back: the logs in one archive)
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
