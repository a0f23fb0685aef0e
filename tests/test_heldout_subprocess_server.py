"""The subprocess-server held-out script (examples/heldout/subprocess_server_serve.py) on the CPU.

It serves a DeepFM scorer (first-order weights, the FM term over 8 fields' embeddings, a deep
MLP over the embeddings and the dense features) from a separate server process: the load
generator starts the same file with ``--serve`` by ``subprocess.Popen``, reads the port it prints
first, sends length-prefixed binary requests over one persistent TCP connection per client thread
to a ``ThreadingTCPServer`` (a handler thread per connection) and at the end terminates the server,
which SIGTERM kills. Here its JSON line is checked (the same checksum, exactly, at 1 and 3
threads; the server's exit is SIGTERM's, -15), its requests are made again from the docstring's
description (not through the script's ``make_request``), its parameters are made again from the
docstring's module list (plain ``nn.Embedding``/``nn.Linear`` after ``torch.manual_seed(0)``, the
embeddings re-drawn by ``normal_(std=0.1)`` in the documented order, not through the script's
class), and its checksum is recomputed from them in float64 numpy (the lookups by indexing, the FM
identity, the MLP and the linear part by matmuls, the sigmoid). The server is also started here by
itself and spoken to in the docstring's wire format, from two connections at once.
"""

from __future__ import annotations

import ast
import signal
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn
from test_heldout_scripts import HELDOUT, TINY, _tiny_run

NAME = "subprocess_server_serve.py"
ARGS = {k: int(v) for k, v in zip(TINY[NAME][::2], TINY[NAME][1::2])}
QUERIES, VOCAB = ARGS["--queries"], ARGS["--vocab"]
#: the docstring's defaults and sizes: fields, fewest and most rows a request, embedding width,
#: dense features, the deep MLP's hidden widths, the embeddings' re-drawn standard deviation
FIELDS, MIN_ROWS, MAX_ROWS, DIM, DENSE, HIDDEN, STD = 8, 16, 128, 16, 13, (128, 64), 0.1


def _request(seed: int, rid: int) -> tuple[np.ndarray, np.ndarray]:
    """Request ``rid`` as the docstring describes it: ``default_rng([seed, rid])``, then the row
    count (16..128), the dense features (float32), the ids ``[rows, 8]`` in ``[0, vocab)``."""
    rng = np.random.default_rng([seed, rid])
    rows = rng.integers(MIN_ROWS, MAX_ROWS + 1)
    dense = rng.standard_normal((rows, DENSE)).astype(np.float32)
    ids = rng.integers(0, VOCAB, (rows, FIELDS))
    return dense, ids


def _requests():
    return [_request(0, rid) for rid in range(QUERIES)]


def _docstring_params() -> dict[str, np.ndarray]:
    """The parameters as the docstring says they are made: after ``torch.manual_seed(0)``, the 8
    first-order embeddings, the 8 16-wide ones, the dense Linear, the deep MLP's three Linears, each
    with PyTorch's default initialization; then every embedding re-drawn by ``normal_(std=0.1)``,
    the first-order ones first. Named as the script's ``state_dict`` names them."""
    torch.manual_seed(0)
    mods = {f"first.{f}": nn.Embedding(VOCAB, 1) for f in range(FIELDS)}
    mods |= {f"embs.{f}": nn.Embedding(VOCAB, DIM) for f in range(FIELDS)}
    mods["linear"] = nn.Linear(DENSE, 1)
    mods["deep.0"] = nn.Linear(FIELDS * DIM + DENSE, HIDDEN[0])
    mods["deep.2"] = nn.Linear(HIDDEN[0], HIDDEN[1])
    mods["deep.4"] = nn.Linear(HIDDEN[1], 1)
    for f in range(FIELDS):
        nn.init.normal_(mods[f"first.{f}"].weight, std=STD)
    for f in range(FIELDS):
        nn.init.normal_(mods[f"embs.{f}"].weight, std=STD)
    return {f"{m}.{k}": v.detach().double().numpy() for m, mod in mods.items()
            for k, v in mod.state_dict().items()}


def _hand_scores(p: dict, dense: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """[rows] scores in float64 from the parameters alone, no module called."""
    x = dense.astype(np.float64)
    first = (x @ p["linear.weight"].T + p["linear.bias"])[:, 0]
    first += sum(p[f"first.{f}.weight"][ids[:, f], 0] for f in range(FIELDS))
    v = np.stack([p[f"embs.{f}.weight"][ids[:, f]] for f in range(FIELDS)], axis=1)  # [rows, F, DIM]
    fm = 0.5 * (v.sum(1) ** 2 - (v**2).sum(1)).sum(1)
    h = np.concatenate([v.reshape(len(ids), -1), x], axis=1)
    h = np.maximum(h @ p["deep.0.weight"].T + p["deep.0.bias"], 0.0)
    h = np.maximum(h @ p["deep.2.weight"].T + p["deep.2.bias"], 0.0)
    deep = (h @ p["deep.4.weight"].T + p["deep.4.bias"])[:, 0]
    return 1.0 / (1.0 + np.exp(-(first + fm + deep)))


@pytest.fixture(scope="module")
def model():
    """The script's module and its model as the server builds it (``torch.manual_seed(seed)``,
    then ``DeepFM(vocab)``); used for its seeded parameters and a check of the hand math."""
    with _tiny_run(NAME) as (mod, a):
        assert int(a["--vocab"]) == VOCAB
        net = mod.DeepFM(VOCAB).eval()
    return mod, net


def test_json_line_and_the_same_checksum_at_every_thread_count(heldout_json):
    """The keys of the JSON line; rows_total is the row count of the requests made from the
    docstring; the server was ended by SIGTERM (-15) at every thread count; the checksum is
    exactly the same at 1 and 3 threads."""
    rows_total = sum(len(d) for d, _ in _requests())
    for t, r in heldout_json.items():
        assert set(r) == {"script", "threads", "queries", "qps", "p50_ms", "p99_ms", "rows_total", "server_exit",
                          "checksum"}
        assert r["script"] == "subprocess_server_serve" and r["threads"] == t and r["queries"] == QUERIES
        assert r["qps"] > 0 and 0 < r["p50_ms"] <= r["p99_ms"]
        assert r["rows_total"] == rows_total
        assert r["server_exit"] == -signal.SIGTERM == -15
        assert isinstance(r["checksum"], float) and np.isfinite(r["checksum"])
    assert heldout_json[1]["checksum"] == heldout_json[3]["checksum"]


def test_requests_are_as_the_docstring_says(model):
    """The script's own requests are the arrays made from the docstring; the row counts change
    within 16..128, and the ids stay within the vocabulary."""
    mod, _ = model
    counts = set()
    for rid, (dense, ids) in enumerate(_requests()):
        d, i = mod.make_request(0, rid, VOCAB, MAX_ROWS)
        assert d.dtype == np.float32 and i.dtype == np.int64
        assert np.array_equal(d, dense) and np.array_equal(i, ids)
        assert MIN_ROWS <= len(ids) <= MAX_ROWS and ids.shape == (len(ids), FIELDS)
        assert dense.shape == (len(ids), DENSE) and 0 <= ids.min() and ids.max() < VOCAB
        counts.add(len(ids))
    assert len(counts) > QUERIES // 2


def test_parameters_are_as_the_docstring_says(model):
    """The script's model holds exactly the parameters made from the docstring's module list and
    re-draws (same names, shapes and values); the embeddings are the small re-drawn ones."""
    _, net = model
    sd = net.state_dict()
    p = _docstring_params()
    assert set(sd) == set(p)
    for k, v in p.items():
        assert np.array_equal(sd[k].double().numpy(), v), k
    assert 0.09 < p["embs.0.weight"].std() < 0.11 and 0.09 < p["first.7.weight"].std() < 0.11


def test_checksum_recomputed_by_hand(heldout_json, model):
    """Every request made again from the docstring and scored by hand in float64 from the
    docstring's parameters; the checksum (the scores in request order dotted with
    ``linspace(1, 2, n)``) agrees with both runs' to 1e-6. The script's model called on the same
    requests agrees score by score (a check on the hand math only)."""
    _, net = model
    p = _docstring_params()
    scores, worst = [], 0.0
    for dense, ids in _requests():
        hand = _hand_scores(p, dense, ids)
        with torch.no_grad():
            f32 = net(torch.from_numpy(dense), torch.from_numpy(ids)).double().numpy()
        worst = max(worst, float(np.abs(f32 - hand).max()))
        scores.append(hand)
    flat = np.concatenate(scores)
    assert 0 < flat.min() and flat.max() < 1 and flat.std() > 0.05  # (not saturated: every term counts)
    # the server scores in float32, the hand in float64: a score's error is the float32 rounding of
    # its logit's sums of a few hundred products times the sigmoid's slope (<= 1/4). The checksum is
    # a sum of positive terms (scores in (0, 1), weights in [1, 2]), so its relative error is at most
    # the largest relative error of a score, worst / smallest score (measured with the TINY sizes: ~8.7e-8
    # over scores 0.10-0.89, ~8.4e-7), shown below 1e-6 here: rel=1e-6
    # holds by that bound, while a wrong field, table, re-draw or layer moves it by far more
    assert worst / flat.min() < 1e-6, (worst, flat.min())
    print(f"largest float32 - float64 score difference: {worst:.2e}, over the smallest score: {worst / flat.min():.1e}")
    expected = float(flat @ np.linspace(1.0, 2.0, flat.size))
    for r in heldout_json.values():
        assert r["checksum"] == pytest.approx(expected, rel=1e-6)


def _message(sock: socket.socket) -> bytes:
    """One length-prefixed message (a little-endian uint32 byte count, then the bytes)."""
    def exact(n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = sock.recv(n - len(out))
            assert chunk, "the server closed the connection"
            out += chunk
        return out

    return exact(struct.unpack("<I", exact(4))[0])


def test_the_server_process_speaks_the_documented_protocol():
    """The script started with ``--serve`` by itself: its first stdout line is a port; two
    connections at once, each with a few requests written in the docstring's wire format (a
    ``<qi`` header, float32 dense, int64 ids, length-prefixed), get float32 scores equal to the
    hand scores to float32 rounding; it serves until SIGTERM, which kills it (-15)."""
    p = _docstring_params()
    proc = subprocess.Popen([sys.executable, str(HELDOUT / NAME), "--serve", "--device", "cpu", "--vocab", str(VOCAB)],
                            stdout=subprocess.PIPE, text=True, cwd=HELDOUT)
    try:
        port = int(proc.stdout.readline())
        conns = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(2)]
        for rid in range(6):
            sock = conns[rid % 2]
            dense, ids = _request(0, rid)
            body = struct.pack("<qi", rid, len(dense)) + dense.tobytes() + ids.astype(np.int64).tobytes()
            sock.sendall(struct.pack("<I", len(body)) + body)
            got = np.frombuffer(_message(sock), dtype=np.float32)
            assert got.shape == (len(dense),)
            np.testing.assert_allclose(got, _hand_scores(p, dense, ids), rtol=1e-5, atol=1e-6)
        for sock in conns:
            sock.close()
        assert proc.poll() is None  # still serving with no client: it never exits on its own
    finally:
        proc.terminate()
        code = proc.wait(timeout=60)
        proc.stdout.close()
    assert code == -signal.SIGTERM


def test_the_load_generator_starts_and_ends_the_server_as_documented():
    """In the script's source the server is this file run again with ``--serve``
    (``subprocess.Popen([sys.executable, __file__, "--serve", ...])``), ended with ``terminate``
    then ``wait(timeout=60)``; the server is a ``ThreadingTCPServer`` on 127.0.0.1 port 0, and no
    signal handler is installed (SIGTERM kills it)."""
    src = (HELDOUT / NAME).read_text()
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    (popen,) = [n for n in calls if ast.unparse(n.func) == "subprocess.Popen"]
    argv = popen.args[0]
    assert isinstance(argv, ast.List)
    assert [ast.unparse(e) for e in argv.elts[:3]] == ["sys.executable", "__file__", "'--serve'"]
    texts = {ast.unparse(n) for n in calls}
    assert "proc.terminate()" in texts and "proc.wait(timeout=60)" in texts
    server = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Server")
    assert [ast.unparse(b) for b in server.bases] == ["socketserver.ThreadingTCPServer"]
    assert "Server(('127.0.0.1', 0), ScoreHandler)" in ast.unparse(tree)
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "signal" not in imported and not any(isinstance(n, ast.ImportFrom) and n.module == "signal"
                                                for n in ast.walk(tree))
    assert "threading.local()" in src and "ThreadPoolExecutor(max_workers=args.threads)" in src
