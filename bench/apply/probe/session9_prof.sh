# Ninth session: where the GIL goes in the two-tower and candidates scripts, unhooked and hooked
# (py-spy --gil through bench/apply/gil_profile.py; g8 for two-tower as the suite kept, g4 for
# candidates, which the suite declines). Results in $OUT/prof.tgz.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export CUDA_DEVICE_MAX_CONNECTIONS=32
python3 -m pip install -q --no-index --no-deps .whl/py_spy*.whl 2>/dev/null
RD_GROUPS=8 timeout 250 python3 bench/apply/gil_profile.py /tmp/gp_tt examples/scripts/two_tower_retrieval.py --threads 4 --queries 6000 > /tmp/gp_tt.txt 2>&1
echo "tt rc $? $(grep -h '^\(un\)\?hooked: {' /tmp/gp_tt.txt | cut -c1-170 | tr '\n' ' ')"
RD_GROUPS=4 timeout 250 python3 bench/apply/gil_profile.py /tmp/gp_cand examples/scripts/candidates_ranker.py --threads 4 --queries 3000 > /tmp/gp_cand.txt 2>&1
echo "cand rc $? $(grep -h '^\(un\)\?hooked: {' /tmp/gp_cand.txt | cut -c1-170 | tr '\n' ' ')"
cat /tmp/gp_cand/hook_stats.json | head -c 3000
tar czf $OUT/prof.tgz -C /tmp gp_tt gp_cand gp_tt.txt gp_cand.txt
echo "total $(( $(date +%s) - t0 )) s"
