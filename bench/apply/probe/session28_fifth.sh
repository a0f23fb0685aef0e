# One H200, session 28, fifth call: who gives the GIL up in a hooked DLRM query (g4, lent outputs)
# and in the hand-written server's cpu_only variant (the script's own calls around one graph), by
# bench/apply/gil_waits.py over all threads (the second call filtered on thread names "client",
# which Python 3.12 does not give its threads' OS names: 0 waits named).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
O=/tmp/bt; mkdir -p $O
python3 -c "from recsys_doctor.planning.io import write_plan; from recsys_doctor.planning.whatif import Candidate; write_plan('$O/g4.json', {}, Candidate(4, True, False, True))"
NS="nsys profile -t osrt --sample=none --cpuctxsw=none --osrt-threshold=5000 --osrt-backtrace-threshold=5000 --backtrace=dwarf -f true"
bt() { local w=$1; shift
  timeout 200 "$@" > $O/$w.log 2>&1; echo "$w rc $? $(grep '^{' $O/$w.log | tail -1 | cut -c1-200)"
  nsys export --type sqlite -o $O/$w.sqlite $O/$w.nsys-rep >> $O/$w.log 2>&1
  python3 bench/apply/gil_waits.py $O/$w.sqlite > $OUT/$w.waits.txt 2>&1; head -32 $OUT/$w.waits.txt | cut -c1-200
  rm -f $O/$w.nsys-rep $O/$w.sqlite; }
bt hooked python3 -m recsys_doctor apply $O/g4.json -- $NS -o $O/hooked python3 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 1500
bt handcpu $NS -o $O/handcpu python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 1500 --variant cpu_only
bt handnp $NS -o $O/handnp python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 1500
echo "done [${SECONDS}s]"
