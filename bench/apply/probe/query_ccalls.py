"""What one steady query of the DLRM script calls, hooked (a thread graph, outputs lent) and in the
hand-written server's ``cpu_only`` variant (the script's own calls around one graph, no hook):
``python bench/apply/probe/query_ccalls.py hooked|hand [THREADS]``.

One client thread (or THREADS, all measured) runs 40 warm-up queries, then 400 timed ones
(single-thread latency: the host path without other threads' GIL turns), then one query under
``sys.setprofile``: every C function it called (``c_call`` events, in order, with the Python line
that called it) and the Python functions it ran, by file. Each C call of PyTorch's that releases
the GIL is a hand-off among client threads (~8-10 us of serialized time each at 4 threads,
``results/session28_h200/``)."""

import collections
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

root = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(root / "examples" / "scripts"))
sys.path.insert(0, str(root / "bench" / "apply" / "handwritten"))
import dlrm_numpy_serve as dlrm  # noqa: E402

mode = sys.argv[1]
threads = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if mode == "hooked":
    from recsys_doctor.applying.script_hook import activate_in_process
    from recsys_doctor.planning.io import write_plan
    from recsys_doctor.planning.whatif import Candidate
    undo = activate_in_process(write_plan(Path(tempfile.mkdtemp()) / "plan.json", {}, Candidate(threads, True, False, True)))
torch.manual_seed(0)
model = dlrm.DLRM(100_000).to("cuda").eval()
offsets_np = np.arange(256, dtype=np.int64)


def to_device(a):
    return torch.from_numpy(a).cuda()


def score_script(dense, ids):  # the script's own score()
    with torch.no_grad():
        out = model(to_device(dense), to_device(ids), to_device(offsets_np))
    return out.cpu().numpy()


if mode == "hand":
    import dlrm_graph_serve as hand
    workers = [hand.GraphWorker(model, 256, offsets_np, "cpu_only") for _ in range(threads)]
reqs = [dlrm.make_request(0, i, 256, 100_000) for i in range(64)]
lat: dict[int, float] = {}
trace: list[tuple[str, str]] = []
pyfuncs: collections.Counter[str] = collections.Counter()


def prof(frame, event, arg):
    where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno}"
    if event == "c_call":
        trace.append((getattr(arg, "__qualname__", None) or getattr(arg, "__name__", None) or repr(arg), where))
    elif event == "call":
        pyfuncs[f"{Path(frame.f_code.co_filename).parent.name}/{Path(frame.f_code.co_filename).name}"] += 1


def client(k):
    if mode == "hand":
        torch.cuda.set_stream(workers[k].stream)
        score = workers[k].score
    else:
        score = score_script
    for i in range(40):
        score(*reqs[i % 64])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(400):
        score(*reqs[i % 64])
    lat[k] = (time.perf_counter() - t0) / 400 * 1e6
    if k == 0:
        sys.setprofile(prof)
        score(*reqs[7])
        sys.setprofile(None)


ts = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(f"{mode}, {threads} thread(s): {', '.join(f'{v:.1f}' for v in lat.values())} us a query "
      f"(mean {sum(lat.values()) / len(lat):.1f}); {threads * 1e6 / max(lat.values()):.0f} q/s")
print(f"one query: {len(trace)} C calls, {sum(pyfuncs.values())} Python calls")
for name, where in trace:
    print(f"  C {name:<40} {where}")
for f, n in pyfuncs.most_common(30):
    print(f"  py {n:4d} {f}")
if mode == "hooked":
    st = sys.modules["_recsys_doctor_autoapply"].stats()
    print("thread_replays", st["thread_replays"], "outputs_lent", st["outputs_lent"], "pageable_fast", st["pageable_fast"],
          "fallbacks", st["fallbacks"][:2])
    undo()
