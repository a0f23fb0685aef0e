# One H200, session 26, third call: where the hooked DLRM query's time goes against the hand-written
# graph server (bench/apply/handwritten/dlrm_graph_serve.py), by ablation at 4 client threads, two
# rounds (the order reversed in the second): the server as it is (np), plus the script's three
# torch.from_numpy calls (from_numpy), plus the scores left on the device, cloned after the replay
# and read with .cpu().numpy() as the hook hands them to the script (devout); beside the script
# unhooked and under the hook (g4). ORDER: the runs (the fourth call: ORDER="from_numpy clone_only
# cpu_only devout devout cpu_only clone_only from_numpy", what the clone and the read-back cost apart). 3,000 queries each: every checksum must be the script's.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/ablation.jsonl
run() { [ "$SECONDS" -lt 560 ] && timeout 100 python3 bench/apply/hooked_run.py "$J" "$@"; }
one() {
  case $1 in
    unhooked) run t4 0 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 3000;;
    hooked) run t4 4 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 3000;;
    *) run "$1" 0 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 3000 --variant $1;;
  esac
}
for c in ${ORDER:-unhooked hooked np from_numpy devout devout from_numpy np hooked unhooked}; do one $c; done
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
