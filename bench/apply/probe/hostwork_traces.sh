# One device call: each serving script of the suite (and the plain script) profiled as it is
# under nsys by `recsys-doctor profile --json`, then, on each exported trace, what share of the
# GPU's host-wait idle follows a stretch of >= 50/100/200/500 us in which the launching thread
# made no CUDA call (bench/apply/probe/silent_stretch.py). The smaller traces come back gzipped.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1; export CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p $OUT/t
run() {  # name script args...
  local n=$1; shift
  timeout 150 recsys-doctor profile --json --out /tmp/p_$n "$@" > $OUT/t/$n.json 2> $OUT/t/$n.err
  echo "$n rc=$? $(ls /tmp/p_$n | tr '\n' ' ')"
  local db=$(ls /tmp/p_$n/*.sqlite 2>/dev/null | head -1)
  [ -n "$db" ] && python3 bench/apply/probe/silent_stretch.py "$db" | tee -a $OUT/t/silent.txt && ls -la "$db"
}
run deepfm examples/scripts/deepfm_serve.py -- --threads 4 --queries 600
run candidates examples/scripts/candidates_ranker.py -- --threads 4 --queries 600
run dlrm examples/scripts/dlrm_numpy_serve.py -- --threads 4 --queries 1000
run mmoe examples/scripts/mmoe_ranker.py -- --threads 4 --queries 1000
run twotower examples/scripts/two_tower_retrieval.py -- --threads 4 --queries 1500
run plain examples/plain_serving_script.py -- --threads 8 --duration 1
for n in deepfm candidates; do gzip -c /tmp/p_$n/*.sqlite > $OUT/${n}.sqlite.gz; done
(cd $OUT/t && tar czf ../advise_json.tgz *.json *.err silent.txt) && rm -rf $OUT/t
ls -la $OUT
