"""Serving anchors: the runtime against everything a user could do instead, in one run.

The wide&deep model of ``examples/wdl_serving.py`` (26 EmbeddingBag features + 26 wide,
13 dense, MLP 429-512-256-1, vocabulary 100k), batch 256, Q closed-loop client threads;
one query = host inputs -> GPU -> model -> host output, waited for. Every configuration
runs in its own process (nothing warm carries over), and every client's last output is
checked against the eager model's output for the same inputs.

Columns (configs):
  eager_1stream      eager PyTorch, every thread on one shared stream, per-tensor copies
  graph_pertensor    one CUDA graph + own stream per thread, per-tensor H2D copies outside it
  graph_prepacked    one CUDA graph + own stream per thread whose inputs already sit in one
                     pinned buffer: a query is one H2D copy, ``replay()``, one D2H copy and
                     ``synchronize()`` - the host-path floor of a hand-written server
  graph_cat          graph_prepacked, but each query is packed into the pinned buffer with
                     one ``torch.cat`` (the realistic hand-roll: queries arrive as tensors)
  compile_ro         ``torch.compile(model, mode="reduce-overhead")`` shared by the threads
  serve              ``recsys_doctor.runtime.serve(groups=Q)``: ``served(*tensors)``
  serve_request      the same runtime, zero-copy: ``with served.request() as q`` the client
                     copies its packed query into the slot's pinned buffer (``q.load``) and calls ``q.run()``
  serve_held         serve_request with the request held open by each client thread across its
                     queries (one slot per client, as the hand-roll has one graph per thread)

    python bench/serving/serve_anchors.py                       # writes bench/results/serve_anchors.json
    OUT=dir QS=1,4,8 DUR=2 CONFIGS=serve,graph_prepacked python bench/serving/serve_anchors.py
    SERVE_GROUPS=4 SERVE_SLOTS=1 RECSYS_DOCTOR_LAUNCH=release-gil ...   # runtime variants
    REPEAT=3 ...     # every (Q, config) 3 times, round by round; medians and paired ratios
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from recsys_doctor.errors import first_line

HERE = Path(__file__).resolve().parent
CONFIGS = ["eager_1stream", "graph_pertensor", "graph_prepacked", "graph_cat", "compile_ro", "serve",
           "serve_request", "serve_held"]
BATCH, VOCAB = 256, 100_000


# ------------------------------------------------------------------------------ one config

def _queries(q: int):
    import torch

    sys.path.insert(0, str(HERE.parents[1] / "examples"))
    from wdl_serving import host_query

    out = []
    for k in range(q):
        torch.manual_seed(1000 + k)
        out.append(host_query(BATCH, VOCAB))
    return out


def _flat(args):
    dense, idx, offs = args
    return [dense, *idx, offs]


def _client_loop(q: int, dur: float, fns, *, warmup: int = 5, keep_all: bool = False):
    """Run ``fns[k]()`` back to back on thread k for ``dur`` seconds, after ``warmup`` calls
    each; latencies in s. The outputs: each thread's last one, or with ``keep_all`` every
    one made in the window (to check each request)."""
    lat = [[] for _ in range(q)]
    last = [None] * q
    every = [[] for _ in range(q)]
    errors = []
    stop = [0.0]
    start = [0.0]

    def open_window():  # run by the barrier once every client has warmed up
        start[0] = time.perf_counter()
        stop[0] = start[0] + dur

    ready = threading.Barrier(q + 1, action=open_window)

    def loop(k):
        try:
            fn = fns[k]
            for _ in range(warmup):
                last[k] = fn()
            ready.wait()
            mine, got = lat[k], every[k]
            pc = time.perf_counter
            while True:
                t0 = pc()
                if t0 >= stop[0]:
                    break
                last[k] = fn()
                mine.append(pc() - t0)
                if keep_all:
                    got.append(last[k])
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:  # noqa: BLE001 - reported in the result
            errors.append(first_line(e))
            ready.abort()

    ths = [threading.Thread(target=loop, args=(k,)) for k in range(q)]
    for t in ths:
        t.start()
    try:
        ready.wait()
    except threading.BrokenBarrierError:
        pass
    for t in ths:
        t.join()
    wall = time.perf_counter() - start[0]
    return lat, (every if keep_all else last), errors, wall


def run_one(config: str, q: int, dur: float) -> dict:
    import torch

    sys.path.insert(0, str(HERE.parents[1] / "examples"))
    from wdl_serving import WideDeep

    torch.manual_seed(0)
    model = WideDeep(VOCAB).cuda().eval()
    queries = _queries(q)
    with torch.no_grad():
        ref = [model(a[0].cuda(), [t.cuda() for t in a[1]], a[2].cuda()).cpu() for a in queries]
    torch.cuda.synchronize()
    fns, closer = _make(config, model, queries)
    lat, last, errors, wall = _client_loop(q, dur, fns)
    if closer:
        closer()
    res = {"config": config, "q": q, "errors": errors}
    if config.startswith("serve"):
        res["runtime"] = {"groups": int(os.environ.get("SERVE_GROUPS", q)), "slots": int(os.environ.get("SERVE_SLOTS", 2)),
                          "launch": os.environ.get("RECSYS_DOCTOR_LAUNCH", "keep-gil")}
    all_l = sorted(x for row in lat for x in row)
    if all_l:
        n = len(all_l)
        res.update(queries=n, qps=round(n / wall, 1), p50_ms=round(all_l[n // 2] * 1e3, 3),
                   p99_ms=round(all_l[min(n - 1, int(n * 0.99))] * 1e3, 3))
    diffs = []
    for k in range(q):
        if last[k] is not None:
            diffs.append(float((last[k].float() - ref[k]).abs().max()))
    res["max_abs_diff_vs_eager"] = max(diffs) if diffs else None
    res["outputs_equal"] = bool(diffs) and len(diffs) == q and max(diffs) <= 1e-5
    return res


def _make(config: str, model, queries):
    import torch

    q = len(queries)
    if config == "eager_1stream":
        s = torch.cuda.Stream()

        def mk(a):
            def fn():
                with torch.cuda.stream(s), torch.no_grad():
                    out = model(a[0].to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in a[1]],
                                a[2].to("cuda", non_blocking=True))
                    h = out.to("cpu", non_blocking=True)
                    s.synchronize()
                return h
            return fn
        return [mk(a) for a in queries], None

    if config == "compile_ro":
        cm = torch.compile(model, mode="reduce-overhead")

        def mk(a):
            def fn():
                with torch.no_grad():
                    out = cm(a[0].to("cuda", non_blocking=True), [t.to("cuda", non_blocking=True) for t in a[1]],
                             a[2].to("cuda", non_blocking=True))
                    return out.cpu()
            return fn
        return [mk(a) for a in queries], None

    if config in ("graph_pertensor", "graph_prepacked", "graph_cat"):
        fns = []
        for a in queries:
            fns.append(_graph_client(model, a, config))
        return fns, None

    if config.startswith("serve"):
        from recsys_doctor.runtime import serve

        groups = int(os.environ.get("SERVE_GROUPS", q))
        slots = int(os.environ.get("SERVE_SLOTS", 2))
        served = serve(model, queries[0], groups=groups, merge=True, graphs=True, slots_per_group=slots)
        return _serve_fns(config, served, queries), served.close
    raise SystemExit(f"unknown config {config}")


def _serve_fns(config, served, queries):
    """The runtime's clients: ``served(*tensors)``, or the zero-copy request per query
    (``serve_request``) or held by the client for its whole life (``serve_held``: the
    structure of the hand-roll, one slot per client thread)."""
    if config == "serve":
        return [(lambda a=a: served(*a)) for a in queries]
    if config not in ("serve_request", "serve_held"):
        raise SystemExit(f"unknown config {config}")
    # each client's query as one packed host buffer (what it would receive off the
    # wire); per query it writes it into the slot's pinned buffer and runs
    packed = []
    with served.request() as r:
        for a in queries:
            for dst, src in zip(_flat(r.inputs), _flat(a)):
                dst.copy_(src)
            packed.append(r.buffer.clone())

    def per_query(buf):
        def fn():
            with served.request() as r:
                r.load(buf)
                return r.run().clone()
        return fn

    def held(buf):
        tls = threading.local()

        def fn():
            r = getattr(tls, "r", None)
            if r is None:
                r = tls.r = served.request()  # closed by served.close() at the end
            r.load(buf)
            return r.run().clone()
        return fn
    return [(per_query if config == "serve_request" else held)(b) for b in packed]


def _warm_and_capture(model, s, *args, branches=1):
    """Three eager runs on stream ``s`` (lazy inits), then the forward captured on it;
    returns the graph and its static output. Call inside ``torch.cuda.stream(s)``.
    ``branches`` > 1: the forward's branches captured on that many streams
    (recsys_doctor.runtime._branches, as the runtime captures by default)."""
    import torch

    from recsys_doctor.runtime._branches import branch_streams, branched

    side = branch_streams(torch, branches, None)  # none for 1
    for i in range(3):
        with branched(side if i == 2 else []):
            model(*args)
    s.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s, capture_error_mode="thread_local"), branched(side):
        out = model(*args)
    return g, out


def _graph_client(model, a, config):
    """One client's own stream and CUDA graph (``..._branched``: captured with the forward's
    branches on 4 streams)."""
    import torch

    branches = 4 if config.endswith("_branched") else 1
    config = config.removesuffix("_branched")
    s = torch.cuda.Stream()
    dense_h, idx_h, offs_h = a
    with torch.cuda.stream(s), torch.no_grad():
        if config == "graph_pertensor":
            d_dense = dense_h.cuda()
            d_idx = [t.cuda() for t in idx_h]
            d_offs = offs_h.cuda()
            out_h = torch.empty(BATCH, 1).pin_memory()
            g, out = _warm_and_capture(model, s, d_dense, d_idx, d_offs)

            def fn():
                with torch.cuda.stream(s):
                    d_dense.copy_(dense_h, non_blocking=True)
                    for d, h in zip(d_idx, idx_h):
                        d.copy_(h, non_blocking=True)
                    return _replay_and_fetch(s, g, out, out_h)
            return fn
        # one pinned input buffer (bytes), one device buffer, views for the model
        leaves = _flat(a)
        nbytes = [t.numel() * t.element_size() for t in leaves]
        h_in = torch.empty(sum(nbytes), dtype=torch.uint8).pin_memory()
        d_in = torch.empty_like(h_in, device="cuda")
        views_h, views_d, off = [], [], 0
        for t, nb in zip(leaves, nbytes):
            views_h.append(h_in[off:off + nb].view(t.dtype).view(t.shape))
            views_d.append(d_in[off:off + nb].view(t.dtype).view(t.shape))
            off += nb
        for vh, t in zip(views_h, leaves):
            vh.copy_(t)
        dd, di, do = views_d[0], views_d[1:-1], views_d[-1]
        d_in.copy_(h_in, non_blocking=True)
        g, out = _warm_and_capture(model, s, dd, di, do, branches=branches)
        out_h = torch.empty(tuple(out.shape), dtype=out.dtype).pin_memory()
    bytes_views = [t.view(-1).view(torch.uint8) for t in leaves]

    def fn():
        with torch.cuda.stream(s):
            if config == "graph_cat":  # pack the query with one torch.cat into the pinned buffer
                torch.cat(bytes_views, out=h_in)
            d_in.copy_(h_in, non_blocking=True)
            return _replay_and_fetch(s, g, out, out_h)
    return fn


def _replay_and_fetch(s, g, out, out_h):
    """The hand-roll's query after its inputs are on the GPU: replay, one D2H copy into
    pinned memory, wait for the stream, a copy of the output (inside ``torch.cuda.stream(s)``)."""
    g.replay()
    out_h.copy_(out, non_blocking=True)
    s.synchronize()
    return out_h.clone()


# ------------------------------------------------------------------------------ driver

def _env() -> dict:
    import torch

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # noqa: BLE001
        env["driver"] = None
    try:
        from importlib.metadata import version

        env["cuda_python"] = version("cuda-python")
    except Exception:  # noqa: BLE001
        pass
    return env


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        config, q, dur = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
        try:
            res = run_one(config, q, dur)
        except BaseException as e:  # noqa: BLE001 - a crashing config is a result too
            res = {"config": config, "q": q, "errors": [first_line(e)]}
        print("RESULT " + json.dumps(res), flush=True)
        return
    qs = [int(x) for x in os.environ.get("QS", "1,4,8").split(",")]
    configs = os.environ.get("CONFIGS", ",".join(CONFIGS)).split(",")
    dur = float(os.environ.get("DUR", "2"))
    reps = int(os.environ.get("REPEAT", "1"))
    out = Path(os.environ.get("OUT", HERE / "results"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [_run_config(c, q, dur, rep) for rep in range(reps) for q in qs for c in configs]
    table, ratios = _summarize(rows)
    doc = {"bench": "serve_anchors", "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "env": _env(),
           "batch": BATCH, "vocab": VOCAB, "duration_s": dur, "repeats": reps, "rows": rows, "qps_table": table,
           "ratio_to_graph_prepacked": ratios}
    name = os.environ.get("NAME", "serve_anchors.json")
    (out / name).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({"qps_table": table, "ratio_to_graph_prepacked": ratios}, indent=1))


def _run_config(c: str, q: int, dur: float, rep: int) -> dict:
    """One configuration at Q clients in a fresh process (the ``--one`` mode)."""
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, __file__, "--one", c, str(q), str(dur)], capture_output=True,
                           text=True, timeout=float(os.environ.get("CONFIG_TIMEOUT", "240")))
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        res = json.loads(line[-1][7:]) if line else {
            "config": c, "q": q, "errors": [f"exit {p.returncode}: " + (p.stderr.strip().splitlines() or [""])[-1]]}
    except subprocess.TimeoutExpired:
        res = {"config": c, "q": q, "errors": ["timed out"]}
    res["process_s"] = round(time.time() - t0, 1)
    res["repeat"] = rep
    print(json.dumps(res), flush=True)
    return res


def _summarize(rows: list[dict]) -> tuple[dict, dict]:
    """Median q/s per (Q, config) over the repeats, and the median over repeats of each
    configuration's ratio to the pre-packed hand-roll measured in the same round (rounds
    run the configurations back to back, so a ratio pairs runs minutes apart at most)."""
    per: dict[str, dict[str, list[float]]] = {}
    paired: dict[str, dict[str, list[float]]] = {}
    rounds: dict[tuple[int, int], dict[str, float]] = {}
    for r in rows:
        if r.get("qps"):
            per.setdefault(str(r["q"]), {}).setdefault(r["config"], []).append(r["qps"])
            rounds.setdefault((r["q"], r.get("repeat", 0)), {})[r["config"]] = r["qps"]
    for (q, _), t in rounds.items():
        base = t.get("graph_prepacked")
        for k, v in t.items():
            if base:
                paired.setdefault(str(q), {}).setdefault(k, []).append(v / base)
    table = {q: {c: round(statistics.median(v), 1) for c, v in t.items()} for q, t in per.items()}
    ratios = {q: {c: round(statistics.median(v), 3) for c, v in t.items()} for q, t in paired.items()}
    return table, ratios


if __name__ == "__main__":
    main()
