# One H200, session 28, second call: who gives the GIL up in a query of the hooked DLRM script
# (g4, outputs lent: the hook as merged in session 27) and of the hand-written graph server of the
# same script, each inside nsys with OS-runtime call stacks (as hostprof.sh bt_dlrm), summed by
# bench/apply/gil_waits.py. (py-spy --gil lost the serving threads of the script in the first call.)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
. bench/apply/probe/nsys_osrt.sh
bt() { local w=$1; osrt_run "$@"
  python3 bench/apply/gil_waits.py $O/$w.sqlite client > $O/$w.waits.txt 2>&1; head -30 $O/$w.waits.txt | cut -c1-200
  rm -f $O/$w.nsys-rep $O/$w.sqlite; }
for r in 1 2; do
  bt hooked$r python3 -m recsys_doctor apply $O/g4.json -- $NS -o $O/hooked$r python3 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 1500
  bt hand$r $NS -o $O/hand$r python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 1500
  [ "$SECONDS" -lt 380 ] || break
done
# the same two without nsys, for their rates on this machine
python3 -m recsys_doctor apply $O/g4.json -- python3 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 3000 2>/dev/null | grep '^{' | cut -c1-160
python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 3000 2>/dev/null | grep '^{' | cut -c1-160
echo "done [${SECONDS}s]"
tar czf $OUT/bt.tgz -C $O .
