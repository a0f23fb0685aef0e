# Sourced by bench/apply/hook_ab.sh and bench/apply/knob_ab.sh: the cases they run, each one
# script under the hook with a fixed plan (bench/apply/hooked_run.py; groups 0: unhooked).
# ab_case JSONL LABEL CASE  (run from the repository root; AB_PIN: a command prefix for every run,
# e.g. "taskset -c 0-7" to keep both trees' runs on the same cores)
ab_case() {
  _ab_run() { ${AB_PIN:-} python3 bench/apply/hooked_run.py "$j" "$label" "$@"; }
  local j=$1 label=$2
  case $3 in
    plain4) _ab_run 4 examples/plain_serving_script.py --threads 8 --duration 3;;
    plain8) _ab_run 8 examples/plain_serving_script.py --threads 8 --duration 3;;
    plain0) _ab_run 0 examples/plain_serving_script.py --threads 8 --duration 3;;
    dlrm4) _ab_run 4 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 3000;;
    dlrm2) _ab_run 2 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 6000;;
    dlrm0) _ab_run 0 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 3000;;
    mmoe8) _ab_run 8 examples/scripts/mmoe_ranker.py --threads 4 --queries 3000;;
    tt4) _ab_run 4 examples/scripts/two_tower_retrieval.py --threads 4 --queries 3000;;
    tt8) _ab_run 8 examples/scripts/two_tower_retrieval.py --threads 4 --queries 4000;;
    cand4) _ab_run 4 examples/scripts/candidates_ranker.py --threads 4 --queries 3000;;
    cand0) _ab_run 0 examples/scripts/candidates_ranker.py --threads 4 --queries 3000;;
    amp0) _ab_run 0 examples/heldout/amp_ranker_serve.py --threads 4 --queries 3000;;
    amp2) _ab_run 2 examples/heldout/amp_ranker_serve.py --threads 4 --queries 3000;;
    kjt1) _ab_run 1 examples/heldout/kjt_ranker_serve.py --threads 8 --queries 3000;;
    kjt0) _ab_run 0 examples/heldout/kjt_ranker_serve.py --threads 8 --queries 3000;;
    opt0) _ab_run 0 examples/heldout/optional_features_serve.py --threads 4 --queries 6000;;
    opt2) _ab_run 2 examples/heldout/optional_features_serve.py --threads 4 --queries 6000;;
    ampb2) RD_BATCHING=1 _ab_run 2 examples/heldout/amp_ranker_serve.py --threads 4 --queries 3000;;
    pin0) _ab_run 0 examples/heldout/pinned_stream_serve.py --threads 4 --queries 3000;;
    pin2) _ab_run 2 examples/heldout/pinned_stream_serve.py --threads 4 --queries 3000;;
    pinb2) RD_BATCHING=1 _ab_run 2 examples/heldout/pinned_stream_serve.py --threads 4 --queries 3000;;
    mp0) _ab_run 0 examples/heldout/mp_pool_serve.py --procs 2 --threads 2 --queries 3000;;
    mp2) _ab_run 2 examples/heldout/mp_pool_serve.py --procs 2 --threads 2 --queries 3000;;
    aio0) _ab_run 0 examples/heldout/asyncio_inline_serve.py --concurrency 16 --queries 3000;;
    aio2) _ab_run 2 examples/heldout/asyncio_inline_serve.py --concurrency 16 --queries 3000;;
    cmp0) _ab_run 0 examples/heldout/compiled_ranker_serve.py --threads 4 --queries 3000;;
    cmp2) _ab_run 2 examples/heldout/compiled_ranker_serve.py --threads 4 --queries 3000;;
    cmpro0) _ab_run 0 examples/heldout/compiled_ranker_serve.py --threads 4 --queries 3000 --mode reduce-overhead;;
    cmpro2) _ab_run 2 examples/heldout/compiled_ranker_serve.py --threads 4 --queries 3000 --mode reduce-overhead;;
    dcn4) _ab_run 4 examples/heldout/dcn_frame_serve.py --threads 4 --queries 2000;;
    ref0) _ab_run 0 examples/heldout/model_refresh_serve.py --threads 4 --queries 3000;;
    ref1) _ab_run 1 examples/heldout/model_refresh_serve.py --threads 4 --queries 3000;;
    ref2) _ab_run 2 examples/heldout/model_refresh_serve.py --threads 4 --queries 3000;;
    refb2) RD_BATCHING=1 _ab_run 2 examples/heldout/model_refresh_serve.py --threads 4 --queries 3000;;
    jag0) _ab_run 0 examples/heldout/jagged_dlrm_serve.py --threads 4 --queries 3000;;
    jag2) _ab_run 2 examples/heldout/jagged_dlrm_serve.py --threads 4 --queries 3000;;
    jagb2) RD_BATCHING=1 _ab_run 2 examples/heldout/jagged_dlrm_serve.py --threads 4 --queries 3000;;
    pipe0) _ab_run 0 examples/heldout/feature_pipeline_serve.py --threads 4 --queries 3000;;
    pipe2) _ab_run 2 examples/heldout/feature_pipeline_serve.py --threads 4 --queries 3000;;
    pipe4) _ab_run 4 examples/heldout/feature_pipeline_serve.py --threads 4 --queries 3000;;
    pipe2f) RECSYS_DOCTOR_PLACE=first-call _ab_run 2 examples/heldout/feature_pipeline_serve.py --threads 4 --queries 3000;;
    pipe4f) RECSYS_DOCTOR_PLACE=first-call _ab_run 4 examples/heldout/feature_pipeline_serve.py --threads 4 --queries 3000;;
    plain4f) RECSYS_DOCTOR_PLACE=first-call _ab_run 4 examples/plain_serving_script.py --threads 8 --duration 3;;
    dlrm2f) RECSYS_DOCTOR_PLACE=first-call _ab_run 2 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 6000;;
    mmoe8f) RECSYS_DOCTOR_PLACE=first-call _ab_run 8 examples/scripts/mmoe_ranker.py --threads 4 --queries 3000;;
    topk0) _ab_run 0 examples/heldout/topk_candidates_serve.py --threads 4 --queries 3000;;
    topk2) _ab_run 2 examples/heldout/topk_candidates_serve.py --threads 4 --queries 3000;;
    topk0l) _ab_run 0 examples/heldout/topk_candidates_serve.py --threads 4 --queries 20000;;
    topk2l) _ab_run 2 examples/heldout/topk_candidates_serve.py --threads 4 --queries 20000;;
    own0) _ab_run 0 examples/heldout/own_graphs_serve.py --threads 4 --queries 4000;;
    own2) _ab_run 2 examples/heldout/own_graphs_serve.py --threads 4 --queries 4000;;
    ownw0) _ab_run 0 examples/heldout/own_graphs_serve.py --threads 4 --queries 4000 --capture worker;;
    ownw2) _ab_run 2 examples/heldout/own_graphs_serve.py --threads 4 --queries 4000 --capture worker;;
    batch0) _ab_run 0 examples/heldout/own_batcher_serve.py --threads 16 --queries 4000;;
    batch2) _ab_run 2 examples/heldout/own_batcher_serve.py --threads 16 --queries 4000;;
    early0) _ab_run 0 examples/heldout/early_pool_serve.py --threads 4 --queries 3000;;
    early2) _ab_run 2 examples/heldout/early_pool_serve.py --threads 4 --queries 3000;;
    proc0) _ab_run 0 examples/heldout/proc_pool_serve.py --procs 4 --queries 3000;;
    proc2) _ab_run 2 examples/heldout/proc_pool_serve.py --procs 4 --queries 3000;;
    early4) _ab_run 4 examples/heldout/early_pool_serve.py --threads 4 --queries 3000;;
    early4n) RECSYS_DOCTOR_THREAD_GRAPHS=0 _ab_run 4 examples/heldout/early_pool_serve.py --threads 4 --queries 3000;;
    dlrm2n) RECSYS_DOCTOR_THREAD_GRAPHS=0 _ab_run 2 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 6000;;
    short0) _ab_run 0 examples/heldout/short_threads_serve.py --threads 4 --queries 3000;;
    short2) _ab_run 2 examples/heldout/short_threads_serve.py --threads 4 --queries 3000;;
    short2a) RECSYS_DOCTOR_THREAD_GRAPH_MIN_CALLS=0 _ab_run 2 examples/heldout/short_threads_serve.py --threads 4 --queries 3000;;
    short2n) RECSYS_DOCTOR_THREAD_GRAPHS=0 _ab_run 2 examples/heldout/short_threads_serve.py --threads 4 --queries 3000;;
    wave0) _ab_run 0 examples/heldout/short_threads_serve.py --threads 4 --queries 3000 --spawn wave;;
    wave2) _ab_run 2 examples/heldout/short_threads_serve.py --threads 4 --queries 3000 --spawn wave;;
    wave2a) RECSYS_DOCTOR_THREAD_GRAPH_MIN_CALLS=0 _ab_run 2 examples/heldout/short_threads_serve.py --threads 4 --queries 3000 --spawn wave;;
    early2s) RECSYS_DOCTOR_PLACE=start _ab_run 2 examples/heldout/early_pool_serve.py --threads 4 --queries 3000;;
    train0) _ab_run 0 examples/heldout/amp_accum_train.py --epochs 2;;
    train2) _ab_run 2 examples/heldout/amp_accum_train.py --epochs 2;;
    dfm0) _ab_run 0 examples/scripts/deepfm_serve.py --threads 4 --queries 3000;;
    dfm4) _ab_run 4 examples/scripts/deepfm_serve.py --threads 4 --queries 3000;;
    hdlrm) _ab_run 0 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 3000;;
    hdlrm_fn) _ab_run 0 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 3000 --variant from_numpy;;
    hdlrm_cpu) _ab_run 0 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 3000 --variant cpu_only;;
    hmmoe) _ab_run 0 bench/apply/handwritten/mmoe_graph_ranker.py --threads 4 --queries 3000;;
    hdfm) _ab_run 0 bench/apply/handwritten/deepfm_graph_serve.py --threads 4 --queries 3000;;
    *) echo "unknown case $3";;
  esac
}
