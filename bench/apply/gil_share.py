"""GIL time per query of a script's serving threads, from ``bench/apply/gil_profile.py``'s folded
stacks (``py-spy record --gil -r 200``: a sample is taken only while some thread holds the GIL):
``python bench/apply/gil_share.py DIR FRAME [RATE]`` for a run folder holding ``unhooked`` /
``hooked`` ``.folded`` (or ``.folded.gz``) and ``.json`` (``--by-frame``: also the hook's own samples of the hooked
run by the hook's outermost frame in each, the script's line that entered the hook). FRAME names the script's per-request function as py-spy
prints it (``client (dlrm_numpy_serve.py``): samples whose stack holds it are the serving
threads'. Prints, per run, the GIL seconds of those threads over the run, per query, and as a
ceiling (queries/s if the GIL were never idle and nothing else waited), plus how much of it is
under the hook's frames (recsys_doctor/, the hook's own and what it calls, the model's forward
included where the hook made the call) and the hook's own (:func:`hook_own`: not the model's work)."""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gil_profile import stacks  # noqa: E402 - beside this file


def hook_own(frames: list[str]) -> bool:
    """Whether a sample is the hook's own work: walking up from the innermost frame, the first
    that is the hook's (recsys_doctor/), a module call (``torch/nn/modules/module.py``: the model's
    work, wherever the hook made the call) or the script's own (a ``.py`` file py-spy names without
    a folder) is the hook's. So PyTorch's copy the hook makes counts, and so does its import of the
    runtime at a thread's first call; the model's forward does not."""
    for f in reversed(frames):
        path = f.rpartition(" (")[2]
        if "recsys_doctor/" in path:
            return "bootstrap_inner" not in f
        if "torch/nn/modules/module.py" in path or ("/" not in path and ".py:" in path):
            return False
    return False


def share(folded: Path, frame: str) -> tuple[int, int, int, collections.Counter[str]]:
    """(all samples, the serving threads', those under a recsys_doctor frame, the hook's own by the
    hook's outermost frame in each: ``file.py:line`` of recsys_doctor/, the thread's bootstrap
    wrapper not counted), in one pass over the file."""
    total = serving = hook = 0
    own: collections.Counter[str] = collections.Counter()
    for stack, n in stacks(folded):
        total += n
        if frame in stack:
            serving += n
            frames = stack.split(";")
            ours = [f for f in frames if "recsys_doctor/" in f and "bootstrap_inner" not in f]
            if ours:
                hook += n
                if hook_own(frames):
                    own[ours[0].rpartition("/")[2].rstrip(")")] += n
    return total, serving, hook, own


def main() -> None:
    by_frame = "--by-frame" in sys.argv
    argv = [a for a in sys.argv[1:] if a != "--by-frame"]
    d, frame = Path(argv[0]), argv[1]
    rate = float(argv[2]) if len(argv) > 2 else 200.0
    for run in ("unhooked", "hooked"):
        res = json.loads((d / f"{run}.json").read_text())
        folded = d / f"{run}.folded.gz"  # (gzipped as committed; gil_profile.py writes it plain)
        total, serving, hook, by = share(folded if folded.is_file() else d / f"{run}.folded", frame)
        own = sum(by.values())
        q, qps = res["queries"], res["qps"]
        gil_s = serving / rate
        if not serving:  # (py-spy lost the process's threads: session25_h200/7_gil/)
            print(f"{d.name:<13} {run:<9} {qps:8.1f} q/s  no GIL sample of the serving threads ({frame}): "
                  f"{total} samples in all, none to split")
            continue
        print(f"{d.name:<13} {run:<9} {qps:8.1f} q/s  serving threads' GIL {gil_s:5.2f} s = "
              f"{gil_s / (q / qps):4.0%} of the {q / qps:5.2f} s window, {gil_s / q * 1e6:5.0f} us a query "
              f"(hook frames {hook / rate / q * 1e6:5.0f} us, the hook's own {own / rate / q * 1e6:5.0f} us) "
              f"-> ceiling {q / gil_s:6.0f} q/s")
        if by_frame and run == "hooked":
            for f, n in by.most_common(12):
                print(f"    {n:5d} samples {n / rate / q * 1e6:6.1f} us a query  {f}")


if __name__ == "__main__":
    main()
