"""A serving loop written without a deep-learning framework: CUDA C++ kernels compiled at start-up
with NVRTC (``cuda.core``), launched from Python client threads through cuda-python.

What ``recsys-doctor profile`` / ``advise`` make of a program PyTorch did not make: no ATen
kernel, no ``pt_*`` thread, so the fixes come in CUDA's own terms (``cudaStreamBeginCapture``,
memory pools) and the plan says how to carry it out in CUDA (docs/findings.md, "The words of a
fix"). It is written the way a first version of such a server is: every client thread shares one
stream, each query copies its features from pageable numpy memory (``cuMemcpyHtoDAsync`` from
pageable memory is synchronous), runs ``--layers`` small layers (a scaled add and a ReLU each,
one launch per kernel) and reads its scores back with a copy and a ``cuStreamSynchronize``.

    python examples/cuda_python_serve.py [--threads 4] [--queries 300] [--rows 256] [--layers 12]

Prints one JSON line: ``qps``, ``queries``, ``threads`` and ``checksum`` (the sum of every
query's scores: query ``q`` of thread ``t`` starts from ``x = (t + 1) * 0.001 * (i % 97)``
and ``y = q * 0.01``, each layer ``y = relu(0.5 * x + y)``). Needs an NVIDIA GPU, cuda-python
(``cuda.core``, ``cuda.bindings``) and NVRTC.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np

SOURCE = r"""
extern "C" __global__ void scale_add(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void relu(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = y[i] > 0.f ? y[i] : 0.f;
}
"""


def _check(result):
    """cuda.bindings calls return ``(error, *values)``: raise on an error, else the values."""
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {int(err)}")
    return rest[0] if len(rest) == 1 else rest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--queries", type=int, default=300, help="queries per thread")
    p.add_argument("--rows", type=int, default=256, help="values per query")
    p.add_argument("--layers", type=int, default=12)
    a = p.parse_args()

    from cuda.bindings import driver
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch

    dev = Device()
    dev.set_current()
    prog = Program(SOURCE, code_type="c++", options=ProgramOptions(arch=f"sm_{dev.arch}"))
    mod = prog.compile("cubin", name_expressions=("scale_add", "relu"))
    scale_add, relu = mod.get_kernel("scale_add"), mod.get_kernel("relu")
    stream = dev.create_stream()  # one stream for every client: the first version's way
    n = a.rows
    cfg = LaunchConfig(grid=(n + 127) // 128, block=128)
    nbytes = n * 4
    sums = [0.0] * a.threads

    def client(t: int) -> None:
        dev.set_current()
        x_dev, y_dev = dev.allocate(nbytes, stream=stream), dev.allocate(nbytes, stream=stream)
        x_host = ((t + 1) * 0.001 * (np.arange(n) % 97)).astype(np.float32)
        out = np.empty(n, np.float32)
        total = 0.0
        for q in range(a.queries):
            y_host = np.full(n, q * 0.01, np.float32)
            _check(driver.cuMemcpyHtoDAsync(int(x_dev.handle), x_host.ctypes.data, nbytes, stream.handle))
            _check(driver.cuMemcpyHtoDAsync(int(y_dev.handle), y_host.ctypes.data, nbytes, stream.handle))
            for _ in range(a.layers):
                launch(stream, cfg, scale_add, x_dev, y_dev, np.float32(0.5), np.int32(n))
                launch(stream, cfg, relu, y_dev, np.int32(n))
            _check(driver.cuMemcpyDtoHAsync(out.ctypes.data, int(y_dev.handle), nbytes, stream.handle))
            _check(driver.cuStreamSynchronize(stream.handle))
            total += float(out.sum(dtype=np.float64))
        sums[t] = total
        stream.sync()
        x_dev.close()
        y_dev.close()

    client(0)  # warm-up: module load, first launches
    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(t,), name=f"client-{t}") for t in range(a.threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    dt = time.perf_counter() - t0
    queries = a.threads * a.queries
    print(json.dumps({"qps": round(queries / dt, 1), "queries": queries, "threads": a.threads,
                      "checksum": round(sum(sums), 3)}))


if __name__ == "__main__":
    main()
