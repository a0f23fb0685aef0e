# Twelfth session, second GPU call (H200): where the time goes when the hook makes the top-k
# script (examples/heldout/topk_candidates_serve.py) and the two-stage pipeline script
# (examples/heldout/feature_pipeline_serve.py) 3x slower at 2 groups (first call: 1,298 -> 385
# and 1,151 -> ~380 q/s, outputs equal): py-spy --gil, unhooked and hooked, with the hook's stats.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
python3 -m pip install -q --no-index --no-deps .whl/py_spy*.whl 2>/dev/null
for s in topk_candidates_serve feature_pipeline_serve; do
  RD_GROUPS=2 timeout 200 python3 bench/apply/gil_profile.py /tmp/gp_$s examples/heldout/$s.py --threads 4 --queries 3000 > /tmp/gp_$s.txt 2>&1
  echo "$s rc $? $(grep -h '^\(un\)\?hooked: {' /tmp/gp_$s.txt | cut -c1-170 | tr '\n' ' ') [${SECONDS}s]"
done
tar czf $OUT/prof.tgz -C /tmp gp_topk_candidates_serve gp_feature_pipeline_serve gp_topk_candidates_serve.txt gp_feature_pipeline_serve.txt
