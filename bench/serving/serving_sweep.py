"""Serving sweep (issue 24): Q = 1 ... 128 closed-loop clients of the wide&deep model of
``examples/wdl_serving.py`` (vocab 100k, 256 rows a query) through every way to serve it,
in one run. Each configuration runs in its own process, all Q values in a row; every
request's output is kept and checked against the eager model after the window
(``max_abs_err`` is over every request, not the last).

Configs:
  eager                   eager PyTorch, one shared stream, per-tensor copies
  handroll_prepacked      a CUDA graph + stream per client thread, inputs pre-packed in one
                          pinned buffer (bench/serving/serve_anchors.py's graph_prepacked)
  handroll_prepacked_branched  the same, each graph captured with the forward's branches on 4
                          streams as the runtime captures them (not in the default list)
  runtime_call            serve(groups=8): served(*tensors), unbatched
  runtime_request         serve(groups=8): request().load(packed) / run(), unbatched
  runtime_batched_call    serve(batching=True): served(*tensors)
  runtime_batched_submit  serve(batching=True): served.submit(*tensors).result()
  runtime_batched_async   serve(batching=True): Q coroutines on one loop, await served.infer
  runtime_batched_call_g8 runtime_batched_call with 8 groups instead of 4 (any ``_g<N>``: N groups;
                          any ``_b<N>``: serve(branch_streams=N), ``_b1`` captures on one stream)
  runtime_batched_call_si runtime_batched_call with serve(switch_interval_ms=0.2) (not in the default list)
  <any config>_si<MS>     that config under a GIL switch interval of MS milliseconds (``_si`` alone: 0.2):
                          serve(switch_interval_ms=MS) for the runtime, sys.setswitchinterval before
                          the clients start for the others (e.g. handroll_prepacked_si0.2); without
                          it, serve's default (batching: 0.5 ms) and Python's 5 ms for the rest;
                          runtime_batched_call_si5 is the batched call at Python's 5 ms
  runtime_batched_async_d runtime_batched_async with serve(max_delay_ms=0.5) (not in the default list)
  runtime_batched_call_dr1, _dr2, _dr4, _g8dr4  runtime_batched_call with 1 / 2 / 4 driver threads
                          (4 groups; 8 groups and 4 drivers); any config ``_dr<N>``: N drivers, without
                          it serve's default (2) (not in the default list)
  proto_cdriver           the batcher with its driver in C (bench/serving/cdriver/, an experiment,
                          not the runtime; build it first with bench/serving/cdriver/build.sh)

Columns: q/s, p50/p99 latency, ``gpu_busy_share`` (NVML utilization over the window),
for batched configs the batch sizes seen and ``gpu_busy_est`` (sum over batches of the
bucket's measured GPU time / wall), and per-bucket GPU time (``bucket_gpu_us``).

    python bench/serving/serving_sweep.py                          # bench/results/serving_sweep_h100.json
    OUT=dir QS=1,32 CONFIGS=runtime_batched_call DUR=1 python bench/serving/serving_sweep.py
    MAX_BATCH=32 ... python bench/serving/serving_sweep.py         # serve(max_batch=32) (unset: serve's default)
    python bench/serving/serving_sweep.py --plot results.json out.png
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "32")  # > 8 streams (before CUDA starts)
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "examples"))

CONFIGS = ["eager", "handroll_prepacked", "runtime_call", "runtime_request", "runtime_batched_call",
           "runtime_batched_submit", "runtime_batched_async", "runtime_batched_call_g8", "runtime_batched_call_si5",
           "handroll_prepacked_si0.5", "runtime_batched_call_dr1", "runtime_batched_async_dr1"]
QS = [1, 4, 8, 16, 32, 64, 128]


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # noqa: BLE001 - the column is then None
        return None, None


def _async_loop(q: int, dur: float, served, queries):
    lat = [[] for _ in range(q)]
    outs = [[] for _ in range(q)]

    async def client(k, stop):
        a, mine, got, pc = queries[k], lat[k], outs[k], time.perf_counter
        while True:
            t0 = pc()
            if t0 >= stop:
                break
            got.append(await served.infer(*a))
            mine.append(pc() - t0)

    async def main():
        await asyncio.gather(*[served.infer(*queries[k]) for k in range(q)])
        t0 = time.perf_counter()
        await asyncio.gather(*[client(k, t0 + dur) for k in range(q)])
        return time.perf_counter() - t0

    wall = asyncio.run(main())
    return lat, outs, [], wall


def _make(config: str, model, queries, served):
    from serve_anchors import _graph_client, _serve_fns
    from serve_anchors import _make as _make_anchor

    if config == "eager":  # PyTorch eager on one shared stream, as bench/serving/serve_anchors.py times it
        return _make_anchor("eager_1stream", model, queries)[0]
    if config in ("handroll_prepacked", "handroll_prepacked_branched"):
        return [_graph_client(model, a, config.replace("handroll", "graph")) for a in queries]
    if config == "runtime_call" or config.startswith("runtime_batched_call"):
        return [(lambda a=a: served(*a)) for a in queries]
    if config == "runtime_batched_submit":
        return [(lambda a=a: served.submit(*a).result()) for a in queries]
    if config.startswith("runtime_request"):  # the zero-copy request per query, as bench/serving/serve_anchors.py times it
        return _serve_fns("serve_request", served, queries)
    if config == "proto_cdriver":  # the experiment of bench/serving/cdriver/ (its driver in C)
        sys.path.insert(0, str(HERE / "cdriver"))
        from proto import make

        call = make(served)
        served._proto = call
        return [(lambda a=a: call(a)) for a in queries]
    raise SystemExit(f"unknown config {config}")


def _switch_interval(config: str) -> tuple[str, float | None]:
    """``config`` without its ``_si<MS>`` suffix, and MS (None: no suffix)."""
    m = re.search(r"_si([0-9.]*)$", config)
    if not m:
        return config, None
    return config[:m.start()], float(m.group(1) or 0.2)


def run_config(config: str, qs: list[int], dur: float) -> list[dict]:
    import torch
    from serve_anchors import VOCAB, _client_loop, _queries
    from wdl_serving import WideDeep

    torch.manual_seed(0)
    model = WideDeep(VOCAB).cuda().eval()
    queries = _queries(max(qs))
    with torch.no_grad():
        ref = [model(a[0].cuda(), [t.cuda() for t in a[1]], a[2].cuda()).cpu() for a in queries]
    torch.cuda.synchronize()
    served = None
    label = config
    config, si_ms = _switch_interval(config)
    if si_ms is not None and not config.startswith("runtime"):
        sys.setswitchinterval(si_ms / 1e3)  # the whole process: the clients' threads start below
    if config.startswith("runtime") or config == "proto_cdriver":
        from recsys_doctor.runtime import serve

        batched = "batched" in config or config == "proto_cdriver"
        drivers = re.search(r"dr(\d+)$", config)
        g = re.search(r"_g(\d+)", config)
        b = re.search(r"_b(\d+)", config)
        served = serve(model, queries[0], groups=int(g.group(1)) if g else 4 if batched else 8, merge=True, graphs=True, slots_per_group=2,
                       **({} if drivers is None else {"drivers": int(drivers.group(1))}),  # (none: serve's default)
                       batching=batched, **({"max_batch": int(os.environ["MAX_BATCH"])} if "MAX_BATCH" in os.environ else {}),
                       **({} if si_ms is None else {"switch_interval_ms": si_ms}),  # (no suffix: serve's default)
                       max_delay_ms=0.5 if config.endswith("_d") else 0.0,
                       branch_streams=int(b.group(1)) if b else 4)
    nv, h = _nvml()
    rows = []
    bucket_us = served.bucket_gpu_us() if served is not None else {}
    fns = None if config.startswith("runtime_batched_async") else _make(config, model, queries, served)
    for q in qs:
        before = dict(served.stats()["batching"].get("batch_sizes", {})) if served is not None else {}
        if nv:
            nv.nvmlDeviceGetUtilizationRates(h)  # start a fresh sampling period
        if config.startswith("runtime_batched_async"):
            lat, outs, errors, wall = _async_loop(q, dur, served, queries[:q])
        else:
            lat, outs, errors, wall = _client_loop(q, dur, fns[:q], warmup=3, keep_all=True)
        util = nv.nvmlDeviceGetUtilizationRates(h).gpu / 100 if nv else None
        row = {"config": label, "Q": q, "errors": errors[:3], "gpu_busy_share": util}
        all_l = sorted(x for r in lat for x in r)
        n = len(all_l)
        if n:
            row.update(queries=n, qps=round(n / wall, 1), p50_ms=round(all_l[n // 2] * 1e3, 3),
                       p99_ms=round(all_l[min(n - 1, int(n * 0.99))] * 1e3, 3))
        errs = [float((torch.stack(o).float() - ref[k]).abs().max()) for k, o in enumerate(outs) if o]
        row["max_abs_err"] = max(errs) if errs else None
        row["checked"] = sum(len(o) for o in outs)
        if getattr(served, "_proto", None) is not None:
            b, n, lent, fatal = served._proto.stats()
            row["proto_stats"] = {"batches": b, "requests": n, "lent": lent, "fatal": fatal}
        elif served is not None and served._batcher is not None:
            after = served.stats()["batching"]["batch_sizes"]
            sizes = {int(s): c - before.get(s, 0) for s, c in after.items() if c - before.get(s, 0)}
            table = served._bworkers[0].table
            row["batch_sizes"] = sizes
            row["gpu_busy_est"] = round(sum(c * bucket_us[table[s]] for s, c in sizes.items()) / 1e6 / wall, 3)
        rows.append(row)
        print("ROW " + json.dumps(row), flush=True)
    if served is not None:
        info = {"config": label, "bucket_gpu_us": bucket_us, "stats": served.stats()["batching"]}
        print("INFO " + json.dumps(info, default=str), flush=True)
        served.close()
    return rows


def _env() -> dict:
    from serve_anchors import _env as env

    e = env()
    e["CUDA_DEVICE_MAX_CONNECTIONS"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    return e


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--plot":
        plot(json.loads(Path(sys.argv[2]).read_text()), Path(sys.argv[3]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        run_config(sys.argv[2], [int(x) for x in sys.argv[3].split(",")], float(sys.argv[4]))
        return
    qs = os.environ.get("QS", ",".join(map(str, QS)))
    dur = os.environ.get("DUR", "1.5")
    out = Path(os.environ.get("OUT", HERE.parent / "results"))
    out.mkdir(parents=True, exist_ok=True)
    env, rows, infos = _env(), [], []
    for c in os.environ.get("CONFIGS", ",".join(CONFIGS)).split(","):
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, __file__, "--one", c, qs, dur], capture_output=True, text=True,
                               timeout=float(os.environ.get("CONFIG_TIMEOUT", "200")))
            got = [json.loads(x[4:]) for x in p.stdout.splitlines() if x.startswith("ROW ")]
            infos += [json.loads(x[5:]) for x in p.stdout.splitlines() if x.startswith("INFO ")]
            if p.returncode:
                got.append({"config": c, "Q": None, "errors": [f"exit {p.returncode}: " + p.stderr.strip()[-400:]]})
        except subprocess.TimeoutExpired as e:
            got = [json.loads(x[4:]) for x in (e.stdout or b"").decode().splitlines() if x.startswith("ROW ")]
            got.append({"config": c, "Q": None, "errors": ["timed out"]})
        for r in got:
            r.update({k: env.get(k) for k in ("gpu", "driver", "torch", "cuda")})
            print(json.dumps({k: r.get(k) for k in ("config", "Q", "qps", "p50_ms", "p99_ms", "max_abs_err",
                                                     "gpu_busy_share", "gpu_busy_est", "batch_sizes", "errors")}),
                  flush=True)
        rows += got
        print(f"# {c}: {time.time() - t0:.0f} s", flush=True)
    name = os.environ.get("NAME", "serving_sweep_h100.json")
    (out / name).write_text(json.dumps(rows, indent=1) + "\n")
    (out / name.replace(".json", "_info.json")).write_text(json.dumps({"env": env, "configs": infos}, indent=1) + "\n")
    plot(rows, out / name.replace(".json", ".png"))


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for c in dict.fromkeys(r["config"] for r in rows):
        pts = sorted((r["Q"], r["qps"], r["p99_ms"]) for r in rows if r["config"] == c and r.get("qps"))
        if pts:
            a1.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=c)
            a2.plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=c)
    for ax, t in ((a1, "queries/s"), (a2, "p99 latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("client threads Q")
        ax.set_ylabel(t)
        ax.grid(alpha=0.3)
    a2.set_yscale("log")
    a1.legend(fontsize=8)
    gpu = next((r.get("gpu") for r in rows if r.get("gpu")), "")
    fig.suptitle(f"wide&deep serving sweep, {gpu}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
