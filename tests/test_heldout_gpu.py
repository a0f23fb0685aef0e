"""The held-out scripts of examples/heldout/ through ``profile --apply``, unmodified (run
on the GPU machine: ``pytest -m gpu tests/test_heldout_gpu.py -k fresh``: a few minutes a
script, so one or two scripts per call on a machine that caps a command at 10 minutes).

The suite's run and checks (tests/test_scripts_suite_gpu.py: ``run_through_apply``,
``check_kept_outputs``) on each of them: one
run as it is (the reference), then ``recsys-doctor profile --apply``; every run the tool
made of the script must print the reference's checksum, the report must carry the hooked
call sites and the syncs per query before and after, and the kept plan must not lose
(>= 0.95x). These scripts are not tuned for: no 8x is required of them, so they run
under their own kind, ``heldout`` (the suite requires 8x of launch-bound ``serve``
scripts only), compared as closely as a serving script. ``RECSYS_DOCTOR_WRITE_SUITE=PATH``
writes each script's row into the JSON list at PATH, as for the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_scripts_suite_gpu as suite

pytestmark = pytest.mark.gpu

HELDOUT = Path(__file__).resolve().parents[1] / "examples" / "heldout"
#: script -> its arguments: 4 client threads, sizes for a few seconds of eager work
ARGS = {
    "dcn_frame_serve.py": ["--threads", "4", "--queries", "2000"],
    "async_rerank_server.py": ["--threads", "4", "--queries", "2000"],
    "fresh_boost_dlrm.py": ["--threads", "4", "--queries", "2000"],
    "amp_ranker_serve.py": ["--threads", "4", "--queries", "3000"],
    "pinned_stream_serve.py": ["--threads", "4", "--queries", "3000"],
    "mp_pool_serve.py": ["--procs", "2", "--threads", "2", "--queries", "3000"],
    "asyncio_inline_serve.py": ["--concurrency", "16", "--queries", "3000"],
    "compiled_ranker_serve.py": ["--threads", "4", "--queries", "3000"],
    "model_refresh_serve.py": ["--threads", "4", "--queries", "3000"],
    "jagged_dlrm_serve.py": ["--threads", "4", "--queries", "3000"],
    "feature_pipeline_serve.py": ["--threads", "4", "--queries", "3000"],
    "topk_candidates_serve.py": ["--threads", "4", "--queries", "3000"],
    "own_graphs_serve.py": ["--threads", "4", "--queries", "4000"],
    "own_batcher_serve.py": ["--threads", "16", "--queries", "4000"],
    "early_pool_serve.py": ["--threads", "4", "--queries", "3000"],
    "proc_pool_serve.py": ["--procs", "4", "--queries", "3000"],
    "short_threads_serve.py": ["--threads", "4", "--queries", "3000"],
    "log_only_serve.py": ["--threads", "4", "--queries", "4000"],
    "cascade_serve.py": ["--threads", "4", "--queries", "3000"],
    "seqrec_serve.py": ["--threads", "4", "--queries", "3000"],
    "frozen_pool_serve.py": ["--threads", "4", "--queries", "4000"],
    "event_timed_serve.py": ["--threads", "4", "--queries", "3000"],
    "http_json_serve.py": ["--threads", "4", "--queries", "3000"],
    "gru4rec_serve.py": ["--threads", "4", "--queries", "4000"],
    "tenant_ple_serve.py": ["--threads", "4", "--queries", "4000"],
    "dataclass_batch_serve.py": ["--threads", "4", "--queries", "4000"],
    "dataparallel_serve.py": ["--threads", "4", "--queries", "6000"],
    "config_reload_serve.py": ["--threads", "4", "--queries", "3000"],
    "multi_gpu_serve.py": ["--threads", "4", "--queries", "3000"],
    "kjt_ranker_serve.py": ["--threads", "4", "--queries", "3000"],
    "triton_backend_serve.py": ["--threads", "4", "--queries", "3000"],
    "online_learning_serve.py": ["--threads", "4", "--queries", "3000"],
    "generative_decode_serve.py": ["--threads", "4", "--queries", "1000"],
    "exported_ranker_serve.py": ["--threads", "4", "--queries", "3000"],
    "optional_features_serve.py": ["--threads", "4", "--queries", "3000"],
    "method_api_serve.py": ["--threads", "4", "--queries", "3000"],
    "replica_per_thread_serve.py": ["--threads", "4", "--queries", "3000"],
    "subprocess_server_serve.py": ["--threads", "4", "--queries", "3000"],
    "executor_procs_serve.py": ["--procs", "4", "--queries", "3000"],
    "offline_scoring_serve.py": ["--workers", "2", "--queries", "2000"],
    "ddp_train.py": ["--samples", "131072", "--batch", "512", "--epochs", "3", "--workers", "2", "--log-every", "20"],
    "log_train.py": ["--steps", "600"],
    "sparse_amp_train.py": ["--epochs", "2"],
    "amp_accum_train.py": ["--epochs", "2"],
}
#: the training loops among them, compared as the suite's training loop is (step time, loss tolerance)
KINDS = {"amp_accum_train.py": "train", "log_train.py": "train", "sparse_amp_train.py": "train",
         "ddp_train.py": "train"}


@pytest.mark.parametrize("name", list(ARGS))
def test_heldout_script_through_profile_apply_keeps_its_outputs(name, tmp_path):
    row, res, stdout = suite.run_through_apply(HELDOUT / name, KINDS.get(name, "heldout"), ARGS[name], tmp_path)
    suite.check_kept_outputs(row, res, stdout)
