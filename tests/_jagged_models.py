"""Models and queries with offsets that end in a total (``include_last_offset``) and with
KeyedJaggedTensor-style features, for the batching tests on the CPU and the GPU. The
models' forwards are CUDA-graph capturable (no host reads, static shapes)."""

from __future__ import annotations

import torch
from torch import nn

DENSE = 13


class BagTotal(nn.Module):
    """Dense rows and ``n_sparse`` index lists sharing one ``offsets`` of ``B + 1``
    entries (``nn.EmbeddingBag(include_last_offset=True)``)."""

    def __init__(self, vocab: int, n_sparse: int = 3, dim: int = 8) -> None:
        super().__init__()
        self.bags = nn.ModuleList(nn.EmbeddingBag(vocab, dim, mode="sum", include_last_offset=True)
                                  for _ in range(n_sparse))
        self.top = nn.Sequential(nn.Linear(DENSE + n_sparse * dim, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, idx, offsets):
        embs = [bag(i, offsets) for bag, i in zip(self.bags, idx)]
        return self.top(torch.cat([dense, *embs], 1))


def bag_total_query(seed: int, rows: int, vocab: int, n_sparse: int = 3, nnz: int = 0):
    """``(dense, [indices] * n_sparse, offsets)``: ``nnz`` indices (default ``2 * rows``) in
    bags of random sizes (some empty), offsets from 0 to ``nnz``."""
    g = torch.Generator().manual_seed(seed)
    nnz = nnz or 2 * rows
    sizes = torch.bincount(torch.randint(0, rows, (nnz,), generator=g), minlength=rows)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)])
    return (torch.randn(rows, DENSE, generator=g), [torch.randint(0, vocab, (nnz,), generator=g) for _ in range(n_sparse)],
            offsets)


class KJTNet(nn.Module):
    """Dense rows and one KeyedJaggedTensor-style feature of ``len(vocabs)`` keys:
    ``values`` and key-major ``lengths`` (``as_offsets``: the KJT's offsets instead), and
    with ``weighted`` per-value weights. A table per key (key ``f``'s ids index a table of
    ``vocabs[f]`` rows), laid out as TorchRec's fused table-batched embedding does: one
    EmbeddingBag, key ``f``'s ids moved past the tables before it, one bag per (key, row)
    by offsets built from the lengths."""

    def __init__(self, vocabs: list[int], dim: int = 8, as_offsets: bool = False, weighted: bool = False) -> None:
        super().__init__()
        self.keys, self.as_offsets, self.weighted = len(vocabs), as_offsets, weighted
        self.register_buffer("base", torch.tensor([0, *vocabs[:-1]]).cumsum(0))
        self.bag = nn.EmbeddingBag(sum(vocabs), dim, mode="sum")
        self.top = nn.Sequential(nn.Linear(DENSE + self.keys * dim, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, dense, values, lengths, weights=None):
        rows, keys = dense.shape[0], self.keys
        if self.as_offsets:
            offsets, lengths = lengths, lengths[1:] - lengths[:-1]
        else:
            offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
        key_ends = lengths.view(keys, rows).sum(1).cumsum(0)
        pos = torch.arange(values.numel(), device=values.device)
        key = torch.searchsorted(key_ends, pos, right=True).clamp(max=keys - 1)
        emb = self.bag(values + self.base[key], offsets[:-1], per_sample_weights=weights)  # [keys * rows, dim]
        return self.top(torch.cat([dense, emb.view(keys, rows, -1).permute(1, 0, 2).reshape(rows, -1)], 1))


def kjt_query(seed: int, rows: int, vocabs: list[int], nnz: int, as_offsets: bool = False, weighted: bool = False):
    """``(dense, values, lengths or offsets[, weights])``: ``nnz`` values spread at random
    over the (key, row) bags (some empty), key-major; key ``f``'s values below ``vocabs[f]``."""
    g = torch.Generator().manual_seed(seed)
    keys = len(vocabs)
    lengths = torch.bincount(torch.randint(0, keys * rows, (nnz,), generator=g), minlength=keys * rows)
    per_key = lengths.view(keys, rows).sum(1).tolist()
    values = torch.cat([torch.randint(0, v, (n,), generator=g) for v, n in zip(vocabs, per_key)])
    jag = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]) if as_offsets else lengths
    q = (torch.randn(rows, DENSE, generator=g), values, jag)
    return (*q, torch.rand(nnz, generator=g)) if weighted else q


def kjt_spec(as_offsets: bool = False, weighted: bool = False) -> list[str]:
    """The declared batch_spec of a :func:`kjt_query`."""
    spec = ["rows", "jagged_values", "jagged_offsets" if as_offsets else "jagged_lengths"]
    return spec + ["jagged_values"] if weighted else spec
