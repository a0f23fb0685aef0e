"""The framework a trace comes from (analyzers/_framework.py), and the fixes said in its words.

The hand-built traces name their kernels and threads as each framework does (TensorFlow's
``tensorflow::functor::...`` and Eigen kernels as nvprof and nsys print them, XLA's fusion
names, PyTorch's ATen kernels); the shared Nsight Systems exports are checked against what their
MANIFEST says each program is (PyTorch or not), and their PyTorch kernel counts against plain SQL.
"""

from __future__ import annotations

import csv
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _sql import sql_rows  # noqa: E402
from _tracebuild import T, api, kern  # noqa: E402

from recsys_doctor.analyzers._framework import apply_hint, framework  # noqa: E402
from recsys_doctor.diagnose.advise import advise, advise_trace  # noqa: E402
from recsys_doctor.options import Options  # noqa: E402
from recsys_doctor.reports.markdown import md_escape, render_markdown  # noqa: E402

TF_KERNELS = ("void Eigen::internal::EigenMetaKernel<Eigen::TensorEvaluator<Eigen::TensorAssignOp<...>>, long>(...)",
              "void tensorflow::functor::ColumnReduceKernel<float const*, float*, cub::Sum>(...)",
              "void tensorflow::GatherOpKernel<float, int, true>(...)")
PT_KERNELS = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>(...)",
              "void at::native::<unnamed>::EmbeddingBag_updateOutputKernel_sum_mean<float, long>(...)")
XLA_KERNELS = ("loop_add_fusion", "input_reduce_fusion_3", "fusion_12", "wrapped_transpose", "loop_multiply_fusion.1")
LIB_KERNELS = ("ampere_sgemm_128x64_tn", "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n", "ncclDevKernel_AllReduce_Sum_f32")


def _trace(names, threads=(), fmt="test"):
    ks = [kern(1000 * i, 1000 * i + 500, corr=i, name=n) for i, n in enumerate(names)]
    tr = T(kernels=ks, threads=[{"pid": 1, "tid": 10 + i, "name": n} for i, n in enumerate(threads)])
    tr.format = fmt
    return tr


@pytest.mark.parametrize("names, threads, want", [
    (TF_KERNELS * 3 + LIB_KERNELS * 5, (), "tensorflow"),
    (PT_KERNELS * 2 + LIB_KERNELS * 5, (), "pytorch"),
    # one TensorFlow op in a PyTorch program: the most marked kernels win
    (PT_KERNELS * 4 + TF_KERNELS[:1], (), "pytorch"),
    # XLA kernels in a TensorFlow program are TensorFlow's (jit_compile)
    (XLA_KERNELS * 4 + TF_KERNELS[:1], (), "tensorflow"),
    (XLA_KERNELS * 2 + LIB_KERNELS * 3, (), "jax"),
    # under a tenth XLA names: not enough to call it JAX
    (XLA_KERNELS[:1] + LIB_KERNELS * 4, (), "cuda"),
    # a CUDA program's own kernels that merely contain "fusion" are not XLA's
    (("fusion_kernel", "my_fusion_step<float>(float*)", "input_kernel(int)") * 3, (), "cuda"),
    (LIB_KERNELS, (), "cuda"),
    # threads decide only where no kernel is marked
    (LIB_KERNELS, ("python3", "tf_Compute", "tf_Compute", "tf_data_private"), "tensorflow"),
    (LIB_KERNELS, ("python3", "pt_autograd_0"), "pytorch"),
    # TSL names every pool's threads tf_<pool>: JAX's XLA pool is no TensorFlow marker, the executor's is
    (XLA_KERNELS * 2, ("python3", "tf_XLAEigen", "tf_XLAEigen"), "jax"),
    (XLA_KERNELS * 2, ("python3", "tf_Compute/1234", "tf_XLAEigen"), "tensorflow"),
    (PT_KERNELS, ("tf_Compute", "tf_Compute", "tf_Compute"), "pytorch"),
])
def test_framework_by_kernels_then_threads(names, threads, want):
    fw = framework(_trace(names, threads))
    assert fw["name"] == want, fw
    ev = fw["evidence"]
    # the counts, by hand from the lists above
    assert ev["tensorflow_kernels"] == sum(n in TF_KERNELS for n in names)
    assert ev["pytorch_kernels"] == sum(n in PT_KERNELS for n in names)
    assert ev["xla_kernels"] == sum(n in XLA_KERNELS for n in names)
    assert ev["tensorflow_threads"] == sum(t.startswith(("tf_Compute", "tf_data")) for t in threads)


def test_a_pytorch_profiler_trace_is_pytorch_by_its_ops_not_its_format():
    """A Kineto trace of a PyTorch program has aten:: ops (CPU ranges); one of a program that runs
    no PyTorch op (profile --backend torch of a cuda-python script) has only its own kernels."""
    tr = _trace(LIB_KERNELS, fmt="kineto-json")
    assert framework(tr)["name"] == "cuda"
    assert framework(tr)["because"].startswith("a PyTorch profiler trace without a PyTorch op or kernel")
    tr = T(kernels=[kern(0, 500, name=LIB_KERNELS[0])],
           ranges=[{"start": 0, "end": 900, "pid": 1, "tid": 1, "name": "aten::mm", "source": "cpu_op",
                    "depth": 0}])
    tr.format = "kineto-json"
    fw = framework(tr)
    assert fw["name"] == "pytorch" and fw["evidence"]["aten_ranges"] == 1


def test_fixes_in_each_frameworks_words():
    """The same short-kernel pattern in a TensorFlow, a JAX, a CUDA and a PyTorch trace: the fix
    names the framework's own API and never another's."""
    def one(kernels: tuple[str, ...]) -> dict[str, str]:
        ks, aps, t = [], [], 0
        for i in range(600):  # 600 short kernels, each after a 20 us launch gap on one thread
            ks.append(kern(t + 20_000, t + 23_000, corr=i, name=kernels[i % len(kernels)]))
            aps.append(api(t, t + 5_000, i, tid=11))
            t += 25_000
        res = advise_trace(T(kernels=ks, api=aps))
        return {f.id: f.recommendation for f in res.findings} | {"plan": " ".join(res.plan.get("notes", []))}

    tf, jax, cuda, pt = (one(k) for k in (TF_KERNELS, XLA_KERNELS, LIB_KERNELS[:2], PT_KERNELS))
    assert "tf.function(jit_compile=True)" in tf["short-kernels"] and "torch" not in tf["short-kernels"]
    assert "jit_compile=True" in tf["graph-candidate"] and "torch" not in tf["graph-candidate"]
    assert "jax.jit" in jax["graph-candidate"] and "torch" not in jax["graph-candidate"]
    assert "cudaStreamBeginCapture" in cuda["graph-candidate"] and "torch" not in cuda["short-kernels"]
    assert "torch.compile" in pt["short-kernels"] and "make_graphed_callables" in pt["graph-candidate"]
    assert tf["plan"].startswith("In TensorFlow: ") and "xla_gpu_enable_command_buffer" in tf["plan"]
    assert jax["plan"].startswith("In JAX: ") and cuda["plan"].startswith("In CUDA: ")
    assert pt["plan"] == ""  # PyTorch: recsys-doctor profile --apply carries the plan out


def test_apply_hint_maps_each_plan_choice():
    plan = {"stream_groups": {"count": 4}, "merge_copy_compute": {"enabled": True}, "cuda_graphs": {"enabled": True}}
    tf = apply_hint(_trace(TF_KERNELS), plan)
    assert tf is not None
    for want in ("TF_GPU_STREAM_GROUP_COUNT=4", "TF_GPU_STREAM_MERGE=true", "TF_PER_STREAM_HOST_ALLOCATOR=true",
                 "4 logical GPUs", "TF_GPU_THREAD_MODE=gpu_private", "jit_compile=True"):
        assert want in tf, want
    no_merge = apply_hint(_trace(TF_KERNELS), {**plan, "merge_copy_compute": {"enabled": False}})
    assert no_merge is not None and "TF_GPU_STREAM_MERGE" not in no_merge
    cuda = apply_hint(_trace(LIB_KERNELS), plan)
    assert cuda is not None and "4 stream groups" in cuda and "cudaMemPoolCreate" in cuda
    assert apply_hint(_trace(PT_KERNELS), plan) is None
    # a training plan's groups are a step's branches: stream scopes, not logical GPUs per serving thread
    train = apply_hint(_trace(TF_KERNELS), {**plan, "kind": "training"})
    assert train is not None and "TF_NODE_LEVEL_MULTISTREAM=true" in train and "tf.cuda.stream_scope" in train
    assert "logical GPUs" not in train and "TF_GPU_STREAM_MERGE" not in train
    cuda_train = apply_hint(_trace(LIB_KERNELS), {**plan, "kind": "training"})
    assert cuda_train is not None and "cudaStreamWaitEvent" in cuda_train and "client thread" not in cuda_train
    # a plan that changes nothing says nothing
    idle = {"stream_groups": {"count": 1}, "merge_copy_compute": {"enabled": False}, "cuda_graphs": {"enabled": False}}
    assert apply_hint(_trace(TF_KERNELS), idle) is None and apply_hint(_trace(LIB_KERNELS), idle) is None


def _manifest(shared: Path) -> dict[str, str]:
    with open(shared / "nsys" / "MANIFEST.tsv", newline="") as fh:
        rows = list(csv.reader(fh, delimiter="\t"))
    head = rows[0]
    return {r[0]: r[head.index("workload_guess")] for r in rows[1:] if r}


PT_SQL = re.compile(r"\bat::|\bc10::|\bat_cuda_detail\b|\bfbgemm_gpu::|^triton_(?:poi|per|red|tem)_")


@pytest.mark.shared
def test_shared_nsys_traces_are_what_their_manifest_says(shared_traces):
    """Every shared export: PyTorch exactly where its MANIFEST calls the program PyTorch and it has
    kernels (uvmTorch has none: nothing to tell it by), CUDA for the C++, OpenACC, CuPy and TensorRT
    programs; the PyTorch kernel count is what SQL reads from the kernel table's demangled names."""
    desc = _manifest(shared_traces)
    assert len(desc) >= 25
    for name, what in desc.items():
        path = shared_traces / "nsys" / name
        tables = {t for (t,) in sql_rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows = (sql_rows(path, "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                               "ON s.id = k.demangledName") if "CUPTI_ACTIVITY_KIND_KERNEL" in tables else [])
        res = advise(str(path), Options())
        fw = res.trace_info["framework"]
        want = "pytorch" if "PyTorch" in what and rows else "cuda"
        assert fw["name"] == want, (name, what, fw)
        assert fw["evidence"]["pytorch_kernels"] == sum(1 for (v,) in rows if PT_SQL.search(v)), name
        assert fw["evidence"]["tensorflow_kernels"] == 0, name
        if want == "cuda":  # a C++ program is not told about PyTorch's APIs
            for f in res.findings:
                if f.id != "no-gpu-activity":  # (names the capture tools: nsys or torch.profiler)
                    text = f"{f.recommendation} {f.action}"
                    assert not re.search(r"torch|PyTorch|\.item\(\)|\.cpu\(\)|DataLoader|pin_memory", text), (name, f.id)
            assert all(n.startswith("In CUDA: ") for n in res.plan.get("notes", [])
                       if n.startswith("In ")), name


@pytest.mark.shared
def test_kineto_traces_are_pytorch_and_keep_pytorch_words(shared_traces):
    paths = sorted((shared_traces / "kineto").glob("*.json*"))
    assert paths
    for path in paths[:4]:
        res = advise(str(path), Options())
        assert res.trace_info["framework"]["name"] == "pytorch", path
        assert not any(n.startswith("In ") for n in res.plan.get("notes", [])), path


def test_reports_say_the_framework():
    res = advise_trace(_trace(TF_KERNELS * 4))
    md = render_markdown(res)
    assert md_escape("framework TensorFlow (12 of 12 kernel executions are TensorFlow's)") in md
    assert res.to_dict()["trace"]["framework"]["name"] == "tensorflow"
    from recsys_doctor.reports.html import render_html
    from recsys_doctor.reports.terminal import render_terminal
    from rich.console import Console

    assert "framework TensorFlow (12 of 12 kernel executions are TensorFlow&#x27;s)" in render_html(res)
    con = Console(record=True, width=200)
    render_terminal(res, console=con)
    assert "framework TensorFlow (12 of 12 kernel executions are TensorFlow's)" in con.export_text()


CUDA_FIXTURE = Path(__file__).parent / "data" / "cuda_python_q4" / "cuda_python_q4.sqlite.gz"


def test_the_project_made_cuda_program_is_told_in_cuda_terms(tmp_path):
    """tests/data/cuda_python_q4 (no PyTorch in the process): a CUDA program, its kernel counts as
    SQL reads them, no fix in PyTorch's words, the plan carried out in CUDA's."""
    import gzip
    import shutil

    db = tmp_path / "t.sqlite"
    with gzip.open(CUDA_FIXTURE) as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    names = dict(sql_rows(db, "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                              "ON s.id = k.demangledName GROUP BY s.value"))
    assert names == {"scale_add": 5 * 150 * 12, "relu": 5 * 150 * 12}  # the README's workload
    res = advise(str(CUDA_FIXTURE), Options())
    fw = res.trace_info["framework"]
    assert fw["name"] == "cuda" and fw["evidence"]["pytorch_kernels"] == 0 and fw["evidence"]["xla_kernels"] == 0
    assert len(res.findings) >= 5
    for f in res.findings:
        assert not re.search(r"torch|PyTorch|\.item\(\)|\.cpu\(\)|DataLoader|pin_memory", f"{f.recommendation} "
                                                                                         f"{f.action}"), f.id
    graph = next(f for f in res.findings if f.id == "graph-candidate")
    assert "cudaStreamBeginCapture" in graph.recommendation
    contention = next(f for f in res.findings if f.id == "stream-contention")
    assert ("cut the launch calls. In CUDA: a cudaStream_t per thread (cudaStreamCreateWithFlags with "
            "cudaStreamNonBlocking).") in contention.recommendation
    notes = res.plan.get("notes", [])
    assert len(notes) == 1 and notes[0].startswith("In CUDA: 4 stream groups: a cudaStream_t per client thread")
