"""Which framework made the trace, and how a fix is said in it.

The findings are CUDA-level (short kernels, launch gaps, syncs, copies), but the way to act on
one depends on what the program is written in: a PyTorch user captures a CUDA graph with
``torch.cuda.graphs``, a TensorFlow user gets one from XLA (``jit_compile=True``), a CUDA C++
program calls ``cudaStreamBeginCapture``. :func:`framework` reads the trace for its makers:

* **PyTorch**: kernels of ATen, c10, FBGEMM or TorchInductor's Triton (``at::native::...``,
  ``triton_poi_fused_...``), threads PyTorch names (``pt_autograd_0``, ``pt_data_pin``,
  ``pt_main_thread``), ``aten::`` ranges (``emit_nvtx``, a PyTorch profiler trace's ops). A
  PyTorch profiler trace is not PyTorch's by its format alone: ``profile --backend torch`` of a
  program that runs no PyTorch op (cuda-python, CuPy) records only that program's kernels.
* **TensorFlow**: kernels of TensorFlow or its Eigen GPU device (``tensorflow::functor::...``,
  ``Eigen::internal::EigenMetaKernel``), threads of its executor and tf.data pools (``tf_Compute``,
  ``tf_data_private...``; TSL names every pool's threads ``tf_<pool>``, JAX's ``tf_XLAEigen`` too).
* **JAX/XLA**: no marker of either, and a tenth or more of the kernel executions named as XLA
  names its fusions (``loop_add_fusion``, ``input_reduce_fusion_3``, ``fusion_12``,
  ``wrapped_transpose``); XLA kernels inside a TensorFlow trace are TensorFlow's (``jit_compile``).
* **CUDA** (no framework recognized): none of these; the advice is said in CUDA's own terms.

The framework with the most marked kernel executions wins (threads and ranges decide only where no
kernel is marked), so a PyTorch program calling one TensorFlow op stays PyTorch. Kernels of shared
libraries (cuBLAS, cuDNN, CUTLASS, NCCL) mark nothing.

:func:`idiom` gives the framework's words for the few places a fix names an API (:data:`IDIOMS`);
:func:`apply_hint` says how to carry a multi-stream plan out where the runtime of this package
(PyTorch) cannot: NVIDIA's Multi-Stream TensorFlow (``TF_GPU_STREAM_GROUP_COUNT``,
``TF_GPU_STREAM_MERGE``, ``TF_PER_STREAM_HOST_ALLOCATOR``), stock TensorFlow's logical GPUs and
``TF_GPU_THREAD_MODE=gpu_private``, XLA's command buffers (CUDA graphs).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..model import Trace
from ._util import per_value, str_contains

__all__ = ["framework", "idiom", "apply_hint", "FRAMEWORKS", "IDIOMS", "LABELS"]

#: the frameworks told apart (a tie between PyTorch and TensorFlow markers goes to PyTorch)
FRAMEWORKS = ("pytorch", "tensorflow", "jax", "cuda")
#: how each is named in a report
LABELS = {"pytorch": "PyTorch", "tensorflow": "TensorFlow", "jax": "JAX/XLA", "cuda": "CUDA"}

#: kernel names each framework's own code gives its kernels
_KERNELS = {
    "pytorch": re.compile(r"\bat::|\bc10::|\bat_cuda_detail\b|\bfbgemm_gpu::|^triton_(?:poi|per|red|tem)_"),
    "tensorflow": re.compile(r"\btensorflow::|\bEigen::internal::|\bstream_executor::"),
}
#: XLA's fusion kernel names (whole names: a CUDA program's ``fusion_kernel`` is not one)
_XLA = re.compile(r"^(?:[a-z0-9]+_)*fusion(?:_\d+)?(?:\.\d+)?$|^(?:loop|input|wrapped)_[a-z0-9_]+(?:\.\d+)?$")
#: thread names each framework gives its threads: PyTorch's ``pt_*``; TensorFlow's executor and
#: tf.data pools (``tf_Compute``, ``tf_data_private...``; other ``tf_*`` threads are TSL's, whose
#: pools JAX's XLA runs too: ``tf_XLAEigen``)
_THREADS = {"pytorch": re.compile(r"^pt_"), "tensorflow": re.compile(r"^tf_(?:Compute|data)")}
#: the share of kernel executions with XLA names that marks a JAX program
XLA_MIN_SHARE = 0.1


def _mark(name: Any) -> str | None:
    """Which framework's own code a kernel name is (``xla``: one of XLA's fusion names), or None."""
    name = str(name)
    return next((fw for fw, rx in _KERNELS.items() if rx.search(name)), "xla" if _XLA.match(name) else None)


def _kernel_counts(trace: Trace) -> dict[str, int]:
    """Kernel executions whose name marks each framework (and ``xla``), the names judged once each."""
    marks = per_value(trace.kernels["name"], _mark) if len(trace.kernels) else np.zeros(0, object)
    return {fw: int((marks == fw).sum()) for fw in ("pytorch", "tensorflow", "xla")}


def _thread_counts(trace: Trace) -> dict[str, int]:
    th = trace.threads
    names = [str(x) for x in th["name"]] if len(th) and "name" in th else []
    return {fw: sum(1 for x in names if rx.match(x)) for fw, rx in _THREADS.items()}


def _aten_ranges(trace: Trace) -> int:
    return int(str_contains(trace.ranges["name"], r"^aten::").sum()) if len(trace.ranges) else 0


def _detect(trace: Trace) -> dict[str, Any]:
    kern = _kernel_counts(trace)
    threads = _thread_counts(trace)
    aten = _aten_ranges(trace)
    evidence: dict[str, Any] = {"pytorch_kernels": kern["pytorch"], "tensorflow_kernels": kern["tensorflow"],
                                "xla_kernels": kern["xla"], "pytorch_threads": threads["pytorch"],
                                "tensorflow_threads": threads["tensorflow"], "aten_ranges": aten}
    if kern["pytorch"] or kern["tensorflow"]:
        name = "tensorflow" if kern["tensorflow"] > kern["pytorch"] else "pytorch"
        why = f"{kern[name]:,} of {len(trace.kernels):,} kernel executions are {LABELS[name]}'s"
    elif threads["pytorch"] or threads["tensorflow"] or aten:
        pt = threads["pytorch"] + aten
        name = "tensorflow" if threads["tensorflow"] > pt else "pytorch"
        pt_parts = ([f"{threads['pytorch']} threads named pt_*"] if threads["pytorch"] else []) + (
            [f"{aten:,} aten:: ranges"] if aten else [])
        why = (f"{threads['tensorflow']} threads of TensorFlow's executor or tf.data (tf_Compute, tf_data...)"
               if name == "tensorflow" else ", ".join(pt_parts))
    elif len(trace.kernels) and kern["xla"] >= XLA_MIN_SHARE * len(trace.kernels):
        name, why = "jax", f"{kern['xla']:,} of {len(trace.kernels):,} kernel executions carry XLA's fusion names"
    else:
        name, why = "cuda", "no kernel, thread or range of PyTorch, TensorFlow or XLA recognized"
        if trace.format == "kineto-json":  # (recsys-doctor profile --backend torch of a program that runs no op)
            why = "a PyTorch profiler trace without a PyTorch op or kernel: the program's own CUDA work"
    return {"name": name, "label": LABELS[name], "because": why, "evidence": evidence}


def framework(trace: Trace) -> dict[str, Any]:
    """``{"name", "label", "because", "evidence"}``: the framework that made ``trace``
    (one of :data:`FRAMEWORKS`), computed once per trace."""
    return trace.derived("framework", lambda: _detect(trace))


#: what a fix says, per framework: the API that does it there
IDIOMS: dict[str, dict[str, str]] = {
    # fusing elementwise tails
    "fuse": {
        "pytorch": "torch.compile",
        "tensorflow": "XLA, tf.function(jit_compile=True)",
        "jax": "jax.jit over the whole step, not per op",
        "cuda": "into one kernel",
    },
    # the same, as the short-kernels action's alternative to a graph
    "fuse_action": {
        "pytorch": "or fuse it with torch.compile",
        "tensorflow": "or fuse it with XLA, tf.function(jit_compile=True)",
        "jax": "or jit the whole step with jax.jit",
        "cuda": "or fuse its kernels",
    },
    # capturing a repeated launch sequence in a CUDA graph
    "graph": {
        "pytorch": "torch.cuda.graphs / make_graphed_callables, static input buffers filled by one pinned copy",
        "tensorflow": "tf.function(jit_compile=True): XLA fuses the step and replays it as CUDA graphs through its "
                      "command buffers (XLA_FLAGS=--xla_gpu_enable_command_buffer); keep input shapes fixed",
        "jax": "jax.jit of the whole step: XLA replays it as CUDA graphs through its command buffers "
               "(XLA_FLAGS=--xla_gpu_enable_command_buffer, --xla_gpu_graph_min_graph_size); keep input shapes fixed",
        "cuda": "cudaStreamBeginCapture ... cudaStreamEndCapture, cudaGraphInstantiate once, cudaGraphLaunch per "
                "query, inputs copied into fixed buffers",
    },
    # stream-contention: where a thread's own stream comes from, after the advice to give it one
    "own_stream": {
        "pytorch": "",
        "tensorflow": " TensorFlow sends every op of a GPU to its one compute stream from the inter-op threads: "
                      "stream groups come from NVIDIA's Multi-Stream TensorFlow or from a logical GPU per serving "
                      "thread (the plan's note).",
        "jax": " JAX gives a thread no stream of its own: batch the concurrent requests into one jitted call "
               "instead (the plan's note).",
        "cuda": " In CUDA: a cudaStream_t per thread (cudaStreamCreateWithFlags with cudaStreamNonBlocking).",
    },
    # what reads a device value on the host (a sync)
    "host_read": {
        "pytorch": ".item(), .cpu() or .tolist()",
        "tensorflow": ".numpy(), int() or float() of a tensor",
        "jax": "np.asarray(), .item() or block_until_ready()",
        "cuda": "a blocking cudaMemcpy to the host",
    },
    # the same, as examples after "blocking cudaMemcpy" (nothing to add in a CUDA program)
    "host_read_examples": {
        "pytorch": " (.item(), .cpu(), .tolist())",
        "tensorflow": " (.numpy(), int() or float() of a tensor)",
        "jax": " (np.asarray(), .item(), block_until_ready())",
        "cuda": "",
    },
    # where the host work of a loop can go instead of the launching thread
    "input_off_thread": {
        "pytorch": "DataLoader workers or more processes",
        "tensorflow": "tf.data with num_parallel_calls and prefetch",
        "jax": "a prefetching input pipeline",
        "cuda": "other threads",
    },
    # FP32 GEMMs on CUDA cores
    "tensor_cores": {
        "pytorch": "torch.backends.cuda.matmul.allow_tf32 = True (torch.set_float32_matmul_precision('high')), or "
                   "run the dense layers under torch.autocast(dtype=torch.bfloat16); on Volta, float16 autocast.",
        "tensorflow": "keep TF32 on (tf.config.experimental.enable_tensor_float_32_execution(True), the default "
                      "since TF 2.4), or tf.keras.mixed_precision.set_global_policy('mixed_bfloat16'); on Volta, "
                      "'mixed_float16'.",
        "jax": "jax.default_matmul_precision('tensorfloat32'), or bfloat16 parameters and activations.",
        "cuda": "cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH), or bfloat16/float16 GEMMs (cublasGemmEx); "
                "on Volta, float16.",
    },
    # allocator churn: the whole advice (the driver calls differ by framework)
    "keep_memory": {
        "pytorch": "Keep device memory in PyTorch's caching allocator instead of going back to the driver: "
                   "do not call torch.cuda.empty_cache() (or free and re-grow pools) in the loop, warm up with "
                   "the largest batch so every block size is cached before the steady state, set "
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to stop fragmentation from forcing new "
                   "cudaMalloc calls, preallocate static buffers (inputs, workspaces, communication buffers), "
                   "and give each stream group its own pool so frees need no cross-stream synchronization.",
        "tensorflow": "Keep device memory in TensorFlow's allocator instead of going back to the driver: do not "
                      "build models, sessions or tf.functions again in the loop (tf.keras.backend.clear_session() "
                      "frees what they held), warm up with the largest batch so the allocator has grown before "
                      "the steady state, or let TF_GPU_ALLOCATOR=cuda_malloc_async keep a stream-ordered pool.",
        "jax": "Keep device memory in XLA's allocator instead of going back to the driver: "
               "XLA_PYTHON_CLIENT_ALLOCATOR=platform allocates and frees every buffer on demand (keep the "
               "default, preallocated allocator), and warm up with the largest batch before the steady state.",
        "cuda": "Keep device memory instead of going back to the driver: allocate buffers once outside the loop, "
                "or use cudaMallocAsync/cudaFreeAsync with a memory pool whose release threshold "
                "(cudaMemPoolAttrReleaseThreshold) keeps the memory; cudaFree synchronizes the device.",
    },
    "keep_memory_action": {
        "pytorch": "stop the steady-state cudaMalloc/cudaFree: warm the caching allocator up, no empty_cache, "
                   "expandable_segments",
        "tensorflow": "stop the steady-state cudaMalloc/cudaFree: nothing rebuilt in the loop, warm up, or "
                      "TF_GPU_ALLOCATOR=cuda_malloc_async",
        "jax": "stop the steady-state cudaMalloc/cudaFree: the default allocator, warm up",
        "cuda": "stop the steady-state cudaMalloc/cudaFree: allocate once, or a stream-ordered pool",
    },
}


def idiom(trace: Trace, key: str) -> str:
    """The words for ``key`` (:data:`IDIOMS`) in the framework that made ``trace``."""
    return IDIOMS[key][framework(trace)["name"]]


def apply_hint(trace: Trace, plan: dict[str, Any] | None) -> str | None:
    """How to carry ``plan`` (the planner's JSON document) out in the trace's framework, where this
    package's runtime (PyTorch) cannot: one paragraph, or None for PyTorch (``recsys-doctor profile
    --apply`` and the runtime do it) and for a plan that asks for neither groups nor graphs. A
    training plan's groups are a step's independent branches, a serving plan's the client threads."""
    name = framework(trace)["name"]
    if name == "pytorch" or not plan:
        return None
    groups = int((plan.get("stream_groups") or {}).get("count") or 1)
    graphs = bool((plan.get("cuda_graphs") or {}).get("enabled"))
    merge = bool((plan.get("merge_copy_compute") or {}).get("enabled"))
    training = plan.get("kind") == "training"
    how = {"tensorflow": _tensorflow_hint, "jax": _jax_hint}.get(name, _cuda_hint)
    parts = how(groups, graphs, merge, training)
    head = {"tensorflow": "In TensorFlow: ", "jax": "In JAX: "}.get(name, "In CUDA: ")
    return (head + "; ".join(parts) + ".") if parts else None


def _tensorflow_hint(groups: int, graphs: bool, merge: bool, training: bool) -> list[str]:
    parts = []
    if groups > 1 and training:
        parts.append(f"{groups} stream groups for the step's independent branches: NVIDIA's Multi-Stream TensorFlow "
                     f"takes TF_GPU_STREAM_GROUP_COUNT={groups} with TF_NODE_LEVEL_MULTISTREAM=true and each branch "
                     "inside the tf.function under tf.cuda.stream_scope(tf.cuda.get_stream(i)); stock TensorFlow "
                     "runs a step's ops on one compute stream")
    elif groups > 1:
        parts.append(f"{groups} stream groups: NVIDIA's Multi-Stream TensorFlow takes "
                     f"TF_GPU_STREAM_GROUP_COUNT={groups}"
                     + (" with TF_GPU_STREAM_MERGE=true (copies on the compute stream)" if merge else "")
                     + " and TF_PER_STREAM_HOST_ALLOCATOR=true; stock TensorFlow gets separate streams and "
                     f"allocators from {groups} logical GPUs (tf.config.set_logical_device_configuration), "
                     "one per serving thread under tf.device, each holding its own copy of the weights")
    if groups > 1 or graphs:
        parts.append("TF_GPU_THREAD_MODE=gpu_private launches the GPU's kernels from threads of its own, not "
                     "from the inter-op pool")
    if graphs:
        parts.append("CUDA graphs with " + IDIOMS["graph"]["tensorflow"])
    return parts


def _jax_hint(groups: int, graphs: bool, merge: bool, training: bool) -> list[str]:
    parts = ["CUDA graphs with " + IDIOMS["graph"]["jax"]] if graphs else []
    if groups > 1 and training:
        parts.append(f"{groups} independent branches: XLA runs a jitted step's kernels in order, so identical "
                     "branches (experts, towers) overlap best as one batched computation (jax.vmap over them)")
    elif groups > 1:
        parts.append(f"{groups} concurrent requests: JAX gives a thread no stream of its own, so batch "
                     "concurrent requests into one jitted call (a batch dimension, jax.vmap) instead")
    return parts


def _cuda_hint(groups: int, graphs: bool, merge: bool, training: bool) -> list[str]:
    parts = []
    if groups > 1 and training:
        parts.append(f"{groups} streams, one per independent branch of the step, each joined back once a step "
                     "(cudaEventRecord, cudaStreamWaitEvent)")
    elif groups > 1:
        parts.append(f"{groups} stream groups: a cudaStream_t per client thread (cudaStreamCreateWithFlags with "
                     "cudaStreamNonBlocking), each with its own memory pool (cudaMemPoolCreate, "
                     "cudaMallocFromPoolAsync)" + (", its copies on the same stream" if merge else ""))
    if graphs:
        parts.append("CUDA graphs with " + IDIOMS["graph"]["cuda"])
    return parts
