"""A model that writes into its own arguments, under the script hook on a real GPU (run on the
GPU machine: ``pytest -m gpu tests/test_autoapply_argwrites_gpu.py``).

A wide&deep-style model hashes its ids in place in ``forward`` (``ids %= vocab``). Under the hook
every call must return eager's scores and leave the script's ids hashed exactly as eager does,
the key running eagerly with ``aten.remainder_`` in the reason (``_autoapply/argwrites.py``); a
model that hashes into a new tensor (``ids % vocab``) is graphed as before. Written after the
eleventh session's last GPU call: not run yet."""

from __future__ import annotations

import pytest
from test_apply_gpu import _run_hooked

pytestmark = pytest.mark.gpu


def _model(torch, in_place: bool):
    class Hashing(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.EmbeddingBag(1000, 16, mode="sum")
            self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def forward(self, ids):
            if in_place:
                ids %= 1000
            else:
                ids = ids % 1000
            return self.mlp(self.emb(ids)).squeeze(1)

    torch.manual_seed(0)
    return Hashing().cuda().eval()


@pytest.mark.parametrize("in_place", [True, False])
def test_a_model_hashing_its_ids_in_place_keeps_the_scripts_ids_and_scores(tmp_path, in_place):
    torch = pytest.importorskip("torch")
    model = _model(torch, in_place)
    threads, rounds = 4, 12
    raw = {(k, r): torch.randint(0, 10**9, (64, 8)) for k in range(threads) for r in range(rounds)}
    with torch.no_grad():
        want = {key: model(ids.cuda().clone()).cpu() for key, ids in raw.items()}
    got, seen = {}, {}

    def client(k: int) -> None:
        with torch.no_grad():
            for r in range(rounds):
                ids = raw[k, r].cuda()
                got[k, r] = model(ids).cpu()
                seen[k, r] = ids.cpu()

    st = _run_hooked(tmp_path, 2, threads, client)
    assert all(torch.allclose(got[key], want[key], atol=1e-6) for key in raw)
    hashed = {key: (ids % 1000 if in_place else ids) for key, ids in raw.items()}
    assert all(torch.equal(seen[key], hashed[key]) for key in raw)  # the script's ids as eager leaves them
    if in_place:
        assert st["replays"] == 0 and any("remainder_" in f for f in st["fallbacks"]), st
    else:
        assert st["replays"] > 0, st
