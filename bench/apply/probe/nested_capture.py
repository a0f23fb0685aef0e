"""Can the sequence model of examples/heldout/seqrec_serve.py be captured in a CUDA graph?

As the script builds it (nn.TransformerEncoder, enable_nested_tensor left True) and with
enable_nested_tensor=False, in eval mode under torch.inference_mode(): an eager call, then a
capture (torch.cuda.graph) of the same call, replayed for new inputs of the same shapes, its
output compared with eager's. One JSON line per variant.

    python bench/apply/probe/nested_capture.py
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence

spec = importlib.util.spec_from_file_location("seqrec", Path(__file__).resolve().parents[3] / "examples/heldout/seqrec_serve.py")
seqrec = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seqrec)


def inputs(rid: int, dev: torch.device):
    hists, cands = seqrec.make_request(0, rid, 32, 100_000, 50, 64)
    hists[0] = hists[0] + [1] * (50 - len(hists[0]))  # the same padded width every request: one shape
    hist = pad_sequence([torch.tensor(h) for h in hists], batch_first=True).to(dev)
    return hist, hist == seqrec.PAD, torch.from_numpy(cands).to(dev)


def main() -> None:
    dev = torch.device("cuda")
    for nested in (True, False):
        torch.manual_seed(0)
        model = seqrec.SeqRec(100_000, 50).to(dev).eval()
        model.encoder.enable_nested_tensor = nested
        model.encoder.use_nested_tensor = nested
        row = {"enable_nested_tensor": nested}
        with torch.inference_mode():
            static = [t.clone() for t in inputs(0, dev)]
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    model(*static)
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(g):
                    out = model(*static)
            except Exception as ex:  # noqa: BLE001 - what fails is the result
                row["captured"] = False
                row["error"] = f"{type(ex).__name__}: {str(ex).splitlines()[0]}"
                torch.cuda.synchronize()
                print(json.dumps(row), flush=True)
                continue
            errs = []
            for rid in range(1, 6):
                new = inputs(rid, dev)
                for a, b in zip(static, new):
                    a.copy_(b)
                g.replay()
                errs.append(float((out - model(*new)).abs().max()))
            row.update(captured=True, max_abs_err=max(errs))
            # with nested tensors, eager's padded positions never reach the output (masked mean):
            # the same scores either way, to rounding
        print(json.dumps(row), flush=True)
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}), file=sys.stderr)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
