# Ninth session, first device call: the GPU tests of HEAD's hook and runtime (commits after
# c8be436 ran on the CPU only), which always-sync operators really sync, and py-spy --gil of
# the hooked dlrm and mmoe scripts (g2 graphs, the suite's chosen plan). Results in $OUT.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
python3 -m pip install -q --no-index --no-deps .whl/py_spy*.whl 2>/dev/null
for f in autoapply apply runtime batching; do
  timeout 240 python3 -m pytest -q -m gpu tests/test_${f}_gpu.py -p no:cacheprovider --tb=short > $OUT/test_${f}_gpu.log 2>&1
  echo "$f rc $? $(tail -n 1 $OUT/test_${f}_gpu.log)"
done
python3 bench/apply/probe/always_sync.py > $OUT/always_sync.jsonl 2>&1; cat $OUT/always_sync.jsonl | cut -c1-200
for s in dlrm mmoe; do
  case $s in dlrm) a="examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 3000";;
             mmoe) a="examples/scripts/mmoe_ranker.py --threads 4 --queries 3000";; esac
  RD_HOOKED_ONLY=1 RD_GROUPS=2 timeout 200 python3 bench/apply/gil_profile.py /tmp/gp_$s $a > /tmp/gp_$s.txt 2>&1
  echo "$s rc $? $(head -n 1 /tmp/gp_$s.txt | cut -c1-200)"
done
tar czf $OUT/gil.tgz -C /tmp gp_dlrm gp_mmoe gp_dlrm.txt gp_mmoe.txt
echo "total $(( $(date +%s) - t0 )) s"
