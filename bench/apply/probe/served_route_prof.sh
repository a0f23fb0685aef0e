# Issue 25: where a hooked plain script's GIL time goes under a batching plan (py-spy --gil,
# bench/apply/gil_profile.py, the hooked run only). OUT=/path bash bench/apply/probe/served_route_prof.sh
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
python3 -m pip install -q --no-index --no-deps .whl/py_spy*.whl 2>/dev/null
RD_HOOKED_ONLY=1 RD_BATCHING=1 RD_GROUPS=${RD_GROUPS:-1} timeout 200 python3 bench/apply/gil_profile.py /tmp/gp examples/plain_serving_script.py --threads 8 --duration 3 > $OUT/gil_g1b.txt 2>&1
cp /tmp/gp/hook_stats.json $OUT/ 2>/dev/null; gzip -c /tmp/gp/hooked.folded > $OUT/hooked.folded.gz
head -3 $OUT/gil_g1b.txt
