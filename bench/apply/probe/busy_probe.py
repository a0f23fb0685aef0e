"""Why the busy-stream GPU test passed on the code before the read-mark fix (session 27's fourth to
sixth calls): the test's scenario once, printing, for each thread graph's mark, the stream it was made
on, the count it read after the capture, and the hook's thread-graph stats."""

import sys
import tempfile
import threading
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_autoapply_gpu import _slow_queries  # noqa: E402

from recsys_doctor.applying.script_hook import activate_in_process  # noqa: E402
from recsys_doctor.planning.io import write_plan  # noqa: E402
from recsys_doctor.planning.whatif import Candidate  # noqa: E402

ref, got, client = _slow_queries(torch, 2, 16, seed=5, salt=31)
undo = activate_in_process(write_plan(Path(tempfile.mkdtemp()) / "plan.json", {}, Candidate(1, True, True, True)))
tg_mod = sys.modules["_recsys_doctor_autoapply.thread_graphs"]
made = tg_mod.ReadMark
lock = threading.Lock()


class BusyStreamMark(made):
    def __init__(self, torch_, device):
        super().__init__(torch_, device)
        self.dev.fill_(-(2**62))
        torch_.cuda.current_stream().synchronize()
        torch_.cuda._sleep(20_000_000)
        self.dev.zero_()
        with lock:
            print("mark made on stream", torch_.cuda.current_stream().cuda_stream, "default",
                  torch_.cuda.default_stream().cuda_stream, "dev", self.dev.data_ptr(), flush=True)

    def captured(self, counted=1):
        print("captured: seen", int(self.seen[0]), "dev now", int(self.dev.item()), flush=True)
        return super().captured(counted) if "counted" in made.captured.__code__.co_varnames else super().captured()


tg_mod.ReadMark = BusyStreamMark
orig_cap = tg_mod._capture_thread


def cap(torch_, g, *a, **k):
    print("capture: group stream", g.stream.cuda_stream, "current", torch_.cuda.current_stream().cuda_stream, flush=True)
    return orig_cap(torch_, g, *a, **k)


tg_mod._capture_thread = cap
ts = [threading.Thread(target=client, args=(k,)) for k in range(2)]
for t in ts:
    t.start()
for t in ts:
    t.join()
st = sys.modules["_recsys_doctor_autoapply"].stats()
undo()
bad = [k for k, w in ref.items() if not torch.allclose(got[k], w, atol=1e-5, rtol=1e-4)]
print("thread_graphs", st["thread_graphs"], "replays", st["thread_replays"], "mark_waits", st["mark_waits"],
      "wrong", len(bad), "fallbacks", st["fallbacks"][:2])
