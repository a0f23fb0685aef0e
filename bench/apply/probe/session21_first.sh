# One H200: why kjt_ranker_serve.py runs at 0.6x under one group with every call eager (session 20:
# placement alone, no graphs, loses as much): the script on side streams with nothing of ours
# (stream_only.py), then py-spy --gil of it unhooked and hooked (g1), and of optional_features
# (g2, 0.55-0.69x in session 20).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
E=examples/heldout; K="$E/kjt_ranker_serve.py --threads 8 --queries 3000"
for r in 1 2; do for m in legacy shared shared_prio per_thread; do
  echo "$m $(timeout 60 python3 bench/apply/probe/stream_only.py $m $K 2>&1 | tail -1 | cut -c1-120)"
done; done
RD_GROUPS=1 timeout 150 python3 bench/apply/gil_profile.py /tmp/gp_kjt $K > /tmp/gp_kjt.txt 2>&1
head -70 /tmp/gp_kjt.txt | cut -c1-200
RD_GROUPS=2 timeout 150 python3 bench/apply/gil_profile.py /tmp/gp_opt $E/optional_features_serve.py --threads 4 --queries 3000 > /tmp/gp_opt.txt 2>&1
head -4 /tmp/gp_opt.txt | cut -c1-200
(cd /tmp && tar czf $OUT/gp.tgz gp_kjt gp_opt gp_kjt.txt gp_opt.txt)
rm -f $OUT/setup.log; ls $OUT
