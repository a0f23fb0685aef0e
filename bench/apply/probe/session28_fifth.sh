# One H200, session 28, fifth call: who gives the GIL up in a hooked DLRM query (g4, lent outputs)
# and in the hand-written server's cpu_only variant (the script's own calls around one graph), by
# bench/apply/gil_waits.py over all threads (the second call filtered on thread names "client",
# which Python 3.12 does not give its threads' OS names: 0 waits named).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
. bench/apply/probe/nsys_osrt.sh
bt() { local w=$1; osrt_run "$@"
  python3 bench/apply/gil_waits.py $O/$w.sqlite > $OUT/$w.waits.txt 2>&1; head -32 $OUT/$w.waits.txt | cut -c1-200
  rm -f $O/$w.nsys-rep $O/$w.sqlite; }
bt hooked python3 -m recsys_doctor apply $O/g4.json -- $NS -o $O/hooked python3 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 1500
bt handcpu $NS -o $O/handcpu python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 1500 --variant cpu_only
bt handnp $NS -o $O/handnp python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 1500
echo "done [${SECONDS}s]"
