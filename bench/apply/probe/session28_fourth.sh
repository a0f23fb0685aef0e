# One H200, session 28, fourth call: where the hooked DLRM query's extra ~110 us (against the
# hand-written cpu_only variant, third call) goes. (1) query_ccalls.py: single-thread and 4-thread
# latency of a steady query, hooked and hand-written cpu_only, and every C call of one query;
# (2) nsys OS-runtime stacks of both at 4 threads: waits per query, and the stacks of the waits
# (osrt_stacks.py: why the loader named no GIL wait in the second call).
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
for m in hooked hand; do for t in 1 4; do
  timeout 90 python3 bench/apply/probe/query_ccalls.py $m $t > $OUT/cc_${m}_$t.txt 2>&1
  head -2 $OUT/cc_${m}_$t.txt
done; done
cat $OUT/cc_hooked_1.txt | grep -v "^  py" | head -150 | cut -c1-150
grep "^  py" $OUT/cc_hooked_1.txt | head -20
grep -v "^  py" $OUT/cc_hand_1.txt | head -60 | cut -c1-150
echo "[${SECONDS}s]"
. bench/apply/probe/nsys_osrt.sh
bt() { local w=$1; osrt_run "$@"
  python3 bench/apply/probe/osrt_stacks.py $O/$w.sqlite 10 > $OUT/$w.stacks.txt 2>&1; head -70 $OUT/$w.stacks.txt | cut -c1-160
  rm -f $O/$w.nsys-rep $O/$w.sqlite; }
bt hooked python3 -m recsys_doctor apply $O/g4.json -- $NS -o $O/hooked python3 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 1500
bt handcpu $NS -o $O/handcpu python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 1500 --variant cpu_only
echo "done [${SECONDS}s]"
(cd $OUT && tar czf txt.tgz *.txt && rm -f *.txt)
