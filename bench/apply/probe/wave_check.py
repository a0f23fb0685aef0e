"""Which request of a bad wave a hooked run of examples/heldout/model_refresh_serve.py got wrong:
each request of the wave scored on the CPU with the version's model and with the version before,
and the run's wave difference matched to single requests' differences (a request scored with
the old weights shows as an exact match). ``python bench/apply/probe/wave_check.py [WAVES.jsonl]``
(hooked_run.py rows, the unhooked one first; 1200 queries, refresh every 150, seed 0)."""

import importlib.util
import json
import sys

import numpy as np
import torch

VOCAB, BATCH, EVERY = 50_000, 256, 150


def load_script():
    spec = importlib.util.spec_from_file_location("refresh", "examples/heldout/model_refresh_serve.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    m = load_script()
    path = sys.argv[1] if len(sys.argv) > 1 else "bench/apply/results/refresh_h200/4_waves/waves.jsonl"
    rows = [json.loads(line) for line in open(path)]
    ref = rows[0]["wave_sums"]

    def model_for(version, temp):
        r = m.Ranker(VOCAB, temperature=temp)
        r.load_state_dict(m.weights(version, 0, VOCAB, "cpu")[0])
        return r.eval()

    temps = {v: m.weights(v, 0, VOCAB, "cpu")[1] for v in range(8)}
    # the waves right after an assign=True refresh: (weights version, temperature) now and before
    cases = {2: (2, temps[0], 1, temps[0]), 6: (6, temps[4], 5, temps[4])}
    for wave, (wv, t, owv, ot) in cases.items():
        new, old = model_for(wv, t), model_for(owv, ot)
        d, total = [], 0.0
        with torch.inference_mode():
            for rid in range(wave * EVERY, (wave + 1) * EVERY):
                ids, dense = (torch.from_numpy(a) for a in m.make_request(0, rid, BATCH, VOCAB))
                a = new(ids, dense).double().sum().item()
                d.append(old(ids, dense).double().sum().item() - a)
                total += a
        print(f"wave {wave}: recomputed sum - unhooked run's {total - ref[wave]:.2e}")
        d = np.array(d)
        for r in rows[1:]:
            diff = r["wave_sums"][wave] - ref[wave]
            if abs(diff) > 1e-3:
                close = np.argsort(np.abs(d - diff))[:3]
                print(f"  run {r['label']}: wave off by {diff:.4f}; closest single requests (index, old - new):",
                      [(int(i), round(float(d[i]), 4)) for i in close])


if __name__ == "__main__":
    main()
