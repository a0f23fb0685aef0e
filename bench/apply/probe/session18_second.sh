# The guard after the retire-order fix: its GPU tests and the held-out script through profile
# --apply; then the suite's serving scripts as they are under profile (nsys) with --host-sample
# (py-spy): launch-bound's host-work share of their baselines and the GIL per thread.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
STOP_AT=200
T=120 gpu_test config_gpu tests/test_autoapply_config_gpu.py
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=170 gpu_test heldout_config tests/test_heldout_gpu.py -k config_reload --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
mkdir -p /tmp/suite
for s in dlrm_numpy_serve mmoe_ranker deepfm_serve candidates_ranker two_tower_retrieval; do
  [ "$SECONDS" -lt 500 ] || break
  timeout 100 recsys-doctor profile examples/scripts/$s.py --json --host-sample --out /tmp/suite/$s -- --threads 4 --queries 2000 > /tmp/suite/$s.json 2> /tmp/suite/$s.err
  echo "$s rc=$? [${SECONDS}s] $(ls -s /tmp/suite/$s/*.sqlite 2>/dev/null | head -1)"
done
(cd /tmp/suite && tar czf $OUT/suite.tgz *.json *.err */*.json 2>/dev/null)
(cd /tmp/suite && find . -name "*.sqlite" -size -60M | tar czf $OUT/suite_sqlite.tgz -T - 2>/dev/null); ls -la $OUT
rm -f $OUT/setup.log
