export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1; export SETUP_DONE=1
R=$OUT/fwd; mkdir -p $R
for f in test_autoapply_gpu test_apply_gpu; do
  timeout 200 python3 -m pytest -q -m gpu tests/$f.py -p no:cacheprovider > $R/$f.log 2>&1; echo "$f rc=$?"; tail -2 $R/$f.log
done
OUT=$R bash bench/gpu/suite_part.sh "candidates or dlrm"
python3 -c "
import json
for r in json.load(open('$R/scripts_suite.json')): print({k: r.get(k) for k in ('script','speedup','outputs_equal','chosen','before','after')})" 2>&1 | cut -c1-400
tar czf $OUT/fwd.tgz -C $OUT fwd
