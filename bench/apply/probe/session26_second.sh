# One H200, session 26, second call: issue 25's two closest scripts (DLRM, MMoE) against the
# strongest thing a user could write instead, in the same call: each script unhooked, under the
# hook with a fixed plan (DLRM g4, MMoE g8), and hand-written around one CUDA graph per client
# thread (bench/apply/handwritten/), at 4 client threads in two rounds (the order of the three
# reversed in the second) and at 16 in one. The first try of this call lost the hand-written
# runs: their warm-up read uninitialized pinned ids (now zeros); the second replayed on the
# legacy default stream, not the captured one (checksums off: the thread set its stream since). 3,000 queries each, so the checksums compare across all three.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
J=$OUT/ceiling.jsonl
run() { [ "$SECONDS" -lt 570 ] && timeout 100 python3 bench/apply/hooked_run.py "$J" "$@"; }
one() {  # one() LABEL CONFIG SCRIPT_KIND THREADS
  local th=$4
  case $1:$2 in
    dlrm:unhooked) run "t$th" 0 examples/scripts/dlrm_numpy_serve.py --threads $th --queries 3000;;
    dlrm:hooked) run "t$th" 4 examples/scripts/dlrm_numpy_serve.py --threads $th --queries 3000;;
    dlrm:hand) run "t$th" 0 bench/apply/handwritten/dlrm_graph_serve.py --threads $th --queries 3000;;
    mmoe:unhooked) run "t$th" 0 examples/scripts/mmoe_ranker.py --threads $th --queries 3000;;
    mmoe:hooked) run "t$th" 8 examples/scripts/mmoe_ranker.py --threads $th --queries 3000;;
    mmoe:hand) run "t$th" 0 bench/apply/handwritten/mmoe_graph_ranker.py --threads $th --queries 3000;;
  esac
}
for r in 1 2 3; do  # 4 threads twice (the order reversed), then 16 threads once
  order="unhooked hooked hand"; [ $r -eq 2 ] && order="hand hooked unhooked"
  for th in $([ $r -eq 3 ] && echo 16 || echo 4); do
    for s in dlrm mmoe; do
      for c in $order; do one $s $c x $th; done
    done
  done
done
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
