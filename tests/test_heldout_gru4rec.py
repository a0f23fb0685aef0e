"""The GRU4Rec-style held-out script (examples/heldout/gru4rec_serve.py) on the CPU.

Its requests all have one shape (sessions padded to ``--max-len``) but different session
lengths, which reach the model only as a CPU tensor for ``pack_padded_sequence``: a replay
keyed by shapes alone would score every request with the lengths of the one it captured.
Here its checksum is the same at 1 and 3 threads, and it is recomputed by running the GRU
recurrence by hand in numpy (float64) over each session's real clicks only; the padded tail,
run through the GRU as if it were clicks, is shown to change the scores.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_heldout_scripts import THREADS, TINY, _load

NAME = "gru4rec_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}


@pytest.fixture(scope="module")
def model():
    """The script's model as it builds it (``torch.manual_seed(seed)``, then the module)."""
    mod = _load(NAME)
    torch.manual_seed(0)
    return mod, mod.GRU4Rec(ARGS["--items"]).eval()


def _requests(mod):
    return [mod.make_request(0, rid, ARGS["--sessions"], ARGS["--items"], ARGS["--max-len"], ARGS["--cands"])
            for rid in range(ARGS["--queries"])]


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _hand_scores(net, clicks, lens, cands) -> np.ndarray:
    """[sessions, cands] scores in float64, the GRU run step by step over each session's real
    clicks only (PyTorch's gates: r, z, n in that order in weight_ih_l0 / weight_hh_l0)."""
    p = {k: v.detach().double().numpy() for k, v in net.state_dict().items()}
    w_ih, w_hh, b_ih, b_hh = (p[f"gru.{k}_l0"] for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    emb = p["item.weight"]
    hidden = w_hh.shape[1]
    out = np.empty(cands.shape)
    for s, n in enumerate(lens):
        h = np.zeros(hidden)
        for x in emb[clicks[s, :n]]:
            gi, gh = w_ih @ x + b_ih, w_hh @ h + b_hh
            r = _sigmoid(gi[:hidden] + gh[:hidden])
            z = _sigmoid(gi[hidden:2 * hidden] + gh[hidden:2 * hidden])
            cand = np.tanh(gi[2 * hidden:] + r * gh[2 * hidden:])
            h = (1 - z) * cand + z * h
        user = p["proj.weight"] @ h + p["proj.bias"]
        out[s] = emb[cands[s]] @ user
    return out


def test_checksum_recomputed_by_a_hand_run_gru(heldout_runs, model):
    """Every request scored by the hand-run recurrence (no ``pack_padded_sequence``, no
    ``nn.GRU``), the top items by a full sort instead of ``topk``; the script's model agrees
    with the hand scores request by request."""
    mod, net = model
    top = ARGS["--top"]
    scores, tops = [], []
    for clicks, lens, cands in _requests(mod):
        s = _hand_scores(net, clicks, lens, cands)
        with torch.no_grad():
            ref = net(torch.from_numpy(clicks), torch.from_numpy(lens), torch.from_numpy(cands)).numpy()
        np.testing.assert_allclose(ref, s, rtol=1e-4, atol=1e-5)
        order = np.argsort(-s, axis=1, kind="stable")[:, :top]
        scores.append(np.take_along_axis(s, order, axis=1).ravel())
        tops.append(np.take_along_axis(cands, order, axis=1).ravel())
    s, t = np.concatenate(scores), np.concatenate(tops).astype(np.float64)
    expected = float(s @ np.linspace(1.0, 2.0, s.size)) + 1e-6 * float(t @ np.linspace(1.0, 2.0, t.size))
    for th in THREADS:
        assert json.loads(heldout_runs[(NAME, th)][0])["checksum"] == pytest.approx(expected, rel=1e-5)


def test_requests_share_one_shape_and_their_lengths_matter(heldout_runs, model):
    """All requests have the same shapes and differ only in their lengths; the GRU run over
    the whole padded width (lengths ignored) scores sessions differently, and every request
    scored with the first request's lengths (what a replay keyed by shapes alone would do)
    gives another checksum than the script's."""
    mod, net = model
    reqs = _requests(mod)
    assert len({tuple(a.shape for a in r) for r in reqs}) == 1
    assert len({tuple(lens) for _, lens, _ in reqs}) > 1
    assert all(lens.dtype == np.int64 and 2 <= lens.min() and lens.max() <= ARGS["--max-len"] for _, lens, _ in reqs)
    assert all((clicks[np.arange(ARGS["--max-len"])[None, :] >= lens[:, None]] == mod.PAD).all()
               for clicks, lens, _ in reqs)
    differ, stale = 0, []
    with torch.no_grad():
        for clicks, lens, cands in reqs:
            x, c = torch.from_numpy(clicks), torch.from_numpy(cands)
            real = net(x, torch.from_numpy(lens), c).numpy()
            full = net(x, torch.full_like(torch.from_numpy(lens), ARGS["--max-len"]), c).numpy()
            _, h_n = net.gru(net.item(x))  # the padded clicks straight through nn.GRU
            unpacked = torch.bmm(net.item(c), net.proj(h_n[-1]).unsqueeze(-1)).squeeze(-1).numpy()
            np.testing.assert_allclose(full, unpacked, rtol=1e-4, atol=1e-5)
            short = lens < ARGS["--max-len"]
            differ += int(short.any() and not np.allclose(real[short], full[short], rtol=1e-3, atol=1e-3))
            np.testing.assert_allclose(real[~short], full[~short], rtol=1e-4, atol=1e-5)
            best = torch.topk(net(x, torch.from_numpy(reqs[0][1]), c), ARGS["--top"], dim=1)
            stale.append(best.values.numpy().ravel())
    assert differ > 0
    flat = np.concatenate(stale).astype(np.float64)
    wrong = float(flat @ np.linspace(1.0, 2.0, flat.size))
    assert json.loads(heldout_runs[(NAME, 1)][0])["checksum"] != pytest.approx(wrong, rel=1e-3)
