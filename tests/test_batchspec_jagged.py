"""Batching offsets with a trailing total (``include_last_offset``) and KeyedJaggedTensor-
style features: regroup against merges written by hand, inference, the declared spec's
checks, the eager check refusing wrong merges, and real models served through the real
CPU worker by many threads, every result against the model run alone on that query."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from _jagged_models import BagTotal, KJTNet, bag_total_query, kjt_query, kjt_spec  # noqa: E402

from recsys_doctor.runtime._batched import BatchSetup, CpuWorker  # noqa: E402
from recsys_doctor.runtime._batcher import Batcher  # noqa: E402
from recsys_doctor.runtime._batchspec import BatchPlan, SpecRefused, infer_spec, perturbed  # noqa: E402
from recsys_doctor.runtime._policy import flatten  # noqa: E402

B, VOCAB = 8, 50
VOCABS = [20, 7, 30]  # a table per key, of different sizes
NNZ = 40


def tensors(args):
    return flatten(args, lambda x: isinstance(x, torch.Tensor))[0]


def regroup(qs, kinds):
    """The queries ``qs`` (lists of tensors) staged into one buffer and regrouped."""
    plan = BatchPlan(qs[0], kinds)
    k = len(qs)
    buf = torch.zeros(k * plan.block, dtype=torch.uint8)
    for dst, src in zip(plan.slot_views(buf, k), [t for q in qs for t in q]):
        dst.copy_(src)
    return plan.regroup(buf, k, torch.arange(k) * plan.shift)


def t(xs, dtype=torch.int64):
    return torch.tensor(xs, dtype=dtype)


# ---------------------------------------------------------------------- regroup by hand

def test_offsets_total_shifted_and_one_total():
    """B = 3 rows, V = 4 indices a query: query j's first 3 offsets + 4 j, then 12."""
    qs = [[torch.zeros(3, 2), t([1, 2, 3, 4]), t([0, 1, 1, 4])],
          [torch.ones(3, 2), t([5, 6, 7, 8]), t([0, 2, 3, 4])],
          [torch.ones(3, 2) * 2, t([9, 9, 9, 9]), t([0, 0, 0, 4])]]
    out = regroup(qs, ["rows", "indices", "offsets_total"])
    assert out[1].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9]
    assert out[2].tolist() == [0, 1, 1, 4, 6, 7, 8, 8, 8, 12]
    assert out[0].shape == (9, 2)
    two = regroup(qs[:2], ["rows", "indices", "offsets_total"])
    assert two[2].tolist() == [0, 1, 1, 4, 6, 7, 8]


def test_offsets_keep_their_dtype():
    qs = [[torch.zeros(2, 1), t([1, 2, 3], torch.int32), t([0, 1, 3], torch.int32)],
          [torch.zeros(2, 1), t([4, 5, 6], torch.int32), t([0, 2, 3], torch.int32)]]
    out = regroup(qs, ["rows", "indices", "offsets_total"])
    assert out[2].dtype == torch.int32 and out[2].tolist() == [0, 1, 3, 5, 6]
    plain = regroup([q[:2] + [q[2][:2]] for q in qs], ["rows", "indices", "offsets"])
    assert plain[2].dtype == torch.int32 and plain[2].tolist() == [0, 1, 3, 5]


# F = 2 keys, B = 2 rows, V = 4 values a query; lengths key-major (key 0 rows 0,1; key 1 rows 0,1).
# Values name their query, key and place: 1xy = query 0 key x, 2xy query 1, 3xy query 2.
Q0 = [torch.zeros(2, 1), t([100, 101, 102, 110]), t([1, 2, 0, 1])]
Q1 = [torch.ones(2, 1), t([200, 201, 210, 211]), t([2, 0, 1, 1])]
Q2 = [torch.ones(2, 1) * 2, t([310, 311, 312, 313]), t([0, 0, 3, 1])]  # key 0 empty


def test_jagged_lengths_merge_key_major_k2_k3():
    out = regroup([Q0, Q1], ["rows", "jagged_values", "jagged_lengths"])
    # key 0: query 0's lengths [1, 2], query 1's [2, 0]; key 1: [0, 1], [1, 1]
    assert out[2].tolist() == [1, 2, 2, 0, 0, 1, 1, 1]
    assert out[1].tolist() == [100, 101, 102, 200, 201, 110, 210, 211]
    assert out[0][:, 0].tolist() == [0, 0, 1, 1]
    out = regroup([Q0, Q1, Q2], ["rows", "jagged_values", "jagged_lengths"])
    assert out[2].tolist() == [1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 3, 1]
    assert out[1].tolist() == [100, 101, 102, 200, 201, 110, 210, 211, 310, 311, 312, 313]


def test_jagged_offsets_and_weights_merge_key_major():
    def as_offsets(q):
        w = q[1].double() / 1000  # weights follow their values
        return [q[0], q[1], torch.cat([t([0]), q[2].cumsum(0)]).int(), w]

    out = regroup([as_offsets(q) for q in (Q0, Q1, Q2)], ["rows", "jagged_values", "jagged_offsets", "jagged_values"])
    # lengths of the k = 3 case above, summed from 0
    assert out[2].dtype == torch.int32
    assert out[2].tolist() == [0, 1, 3, 5, 5, 5, 5, 5, 6, 7, 8, 11, 12]
    want = [100, 101, 102, 200, 201, 110, 210, 211, 310, 311, 312, 313]
    assert out[1].tolist() == want and torch.allclose(out[3], t(want).double() / 1000)


def test_jagged_merge_of_one_query_is_the_query():
    out = regroup([Q1], ["rows", "jagged_values", "jagged_lengths"])
    assert [o.tolist() for o in out] == [q.tolist() for q in Q1]


def test_a_lone_malformed_query_reads_only_its_own_indices():
    """Offsets past the indices would read past the buffer (on a GPU: an illegal address
    that ends the process's CUDA context); a lone query's are kept inside its indices too."""
    out = regroup([[t([1, 2, 3, 4]), t([2, 9, 1])]], ["indices", "offsets"])
    assert out[1].tolist() == [0, 4, 4]  # first 0, clamped to the 4 indices, never decreasing
    out = regroup([[t([1, 2, 3, 4]), t([0, 1, 2, 4])]], ["indices", "offsets"])
    assert out[1].tolist() == [0, 1, 2, 4]  # a well-formed query is unchanged


def test_malformed_lengths_never_index_out_of_range():
    """Lengths that do not sum to the values count (not a KJT): the merge still gathers
    inside the batch's values (no out-of-range read)."""
    bad = [Q1[0], Q1[1], t([9, 9, 9, 9])]
    out = regroup([Q0, bad, Q2], ["rows", "jagged_values", "jagged_lengths"])
    staged = set(Q0[1].tolist() + Q1[1].tolist() + Q2[1].tolist())
    assert out[1].numel() == 12 and set(out[1].tolist()) <= staged


def _split_rows(out, k):
    return list(out.chunk(k))


def _alone(model, q):
    with torch.no_grad():
        return model(*q)


def test_malformed_offsets_move_none_of_their_neighbours():
    """Query 1's offsets start above 0 and run past its indices (plain offsets), or its
    total is wrong (offsets_total): the well-formed queries 0 and 2 of the same batch get
    exactly what each gets alone."""
    torch.manual_seed(3)
    plain = nn.EmbeddingBag(VOCAB, 4, mode="sum")
    total = nn.EmbeddingBag(VOCAB, 4, mode="sum", include_last_offset=True)
    idx = [torch.randint(0, VOCAB, (6,)) for _ in range(3)]
    good_plain, bad_plain = t([0, 2, 5]), t([2, 9, 4])  # 3 bags of 6 indices; bad: starts at 2, 9 > 6
    qs = [[idx[0], good_plain], [idx[1], bad_plain], [idx[2], t([0, 0, 3])]]
    out = regroup(qs, ["indices", "offsets"])
    with torch.no_grad():
        got = _split_rows(plain(out[0], out[1]), 3)
        for j in (0, 2):
            assert torch.equal(got[j], plain(*qs[j])), j
    qs = [[idx[0], t([0, 2, 5, 6])], [idx[1], t([3, 1, 8, 2])], [idx[2], t([0, 0, 3, 6])]]
    out = regroup(qs, ["indices", "offsets_total"])
    with torch.no_grad():
        got = _split_rows(total(out[0], out[1]), 3)
        for j in (0, 2):
            assert torch.equal(got[j], total(*qs[j])), j


@pytest.mark.parametrize("as_offsets", [False, True])
def test_malformed_jagged_lengths_move_none_of_their_neighbours(as_offsets):
    """A query whose lengths sum to more (or fewer) than its values, between two
    well-formed ones: the well-formed queries' outputs equal the model run alone on each."""
    torch.manual_seed(4)
    model = KJTNet(VOCABS, as_offsets=as_offsets).eval()
    qs = [list(kjt_query(s, B, VOCABS, NNZ, as_offsets=as_offsets)) for s in (11, 12, 13, 14)]
    n = len(VOCABS) * B
    over = torch.full((n,), 2, dtype=torch.int64)  # sums to 48 > NNZ = 40
    under = torch.zeros(n, dtype=torch.int64)
    under[::5] = 1  # sums to 5 < 40
    for bad in (over, under):
        q1 = list(qs[1])
        q1[2] = torch.cat([t([0]), bad.cumsum(0)]) if as_offsets else bad
        batch = [qs[0], q1, qs[2], qs[3]]
        out = regroup(batch, kjt_spec(as_offsets))
        got = _split_rows(_alone(model, out), 4)
        for j in (0, 2, 3):
            assert torch.allclose(got[j], _alone(model, batch[j]), atol=1e-6), j


@pytest.mark.parametrize("as_offsets", [False, True])
def test_regroup_needs_no_data_on_the_host(as_offsets):
    """regroup on 'meta' tensors (shapes, no data): a host read (``.item()``, ``.tolist()``)
    or a shape that depends on the data would raise, as they would break a CUDA graph."""
    q = list(kjt_query(1, B, VOCABS, NNZ, as_offsets, weighted=True))
    plan = BatchPlan(q, kjt_spec(as_offsets, weighted=True))
    meta = torch.empty(3 * plan.block, dtype=torch.uint8, device="meta")
    out = plan.regroup(meta, 3, torch.arange(3, device="meta") * plan.shift)
    assert [tuple(o.shape) for o in out] == [(3 * B, 13), (3 * NNZ,), (3 * 3 * B + as_offsets,), (3 * NNZ,)]
    d, idx, off = bag_total_query(0, B, VOCAB)
    plan = BatchPlan(tensors((d, idx, off)), ["rows", *["indices"] * 3, "offsets_total"])
    meta = torch.empty(3 * plan.block, dtype=torch.uint8, device="meta")
    out = plan.regroup(meta, 3, torch.arange(3, device="meta") * plan.shift)
    assert tuple(out[-1].shape) == (3 * B + 1,) and tuple(out[1].shape) == (3 * 2 * B,)


# ---------------------------------------------------------------------- inference and checks

def test_infer_spec_offsets_total_where_it_ends_at_the_index_count():
    q = tensors(bag_total_query(0, B, VOCAB))
    assert infer_spec(q) == ("rows", "indices", "indices", "indices", "offsets_total")
    # B + 1 sorted entries from 0 that end elsewhere are one more index list: then no offsets
    short = q[:-1] + [torch.arange(B + 1)]
    with pytest.raises(SpecRefused, match="0 offsets candidates"):
        infer_spec(short)
    # plain offsets beside a total candidate: two candidates, refused
    with pytest.raises(SpecRefused, match="2 offsets candidates"):
        infer_spec(q + [torch.arange(B)])


def test_jagged_is_declared_not_inferred():
    q = list(kjt_query(0, B, VOCABS, NNZ))
    with pytest.raises(SpecRefused, match="declare batch_spec .a jagged feature"):
        infer_spec(q)
    assert BatchPlan(q, kjt_spec()).jagged.keys == 3


def test_declared_jagged_spec_checked_on_the_example():
    q = list(kjt_query(0, B, VOCABS, NNZ))
    with pytest.raises(SpecRefused, match="exactly one jagged_lengths or jagged_offsets"):
        BatchPlan(q, ["rows", "jagged_values", "jagged_values"])
    with pytest.raises(SpecRefused, match="not a multiple of the 8 rows"):
        BatchPlan([q[0], q[1], q[2][:-1]], kjt_spec())
    with pytest.raises(SpecRefused, match=f"sum to {NNZ} .* where its jagged_values have {NNZ - 1}"):
        BatchPlan([q[0], q[1][:-1], q[2]], kjt_spec())
    with pytest.raises(SpecRefused, match="needs a rows, offsets or offsets_total input"):
        BatchPlan(q[1:], ["jagged_values", "jagged_lengths"])
    d, idx, off = bag_total_query(0, B, VOCAB)
    past = off.clone()
    past[-1] += 1
    with pytest.raises(SpecRefused, match="offsets_total must run from 0 to the 16 indices .* runs from 0 to 17"):
        BatchPlan(tensors((d, idx, past)), ["rows", *["indices"] * 3, "offsets_total"])


def test_perturbed_second_query_is_valid_and_different():
    """Within each key: the same values count and the values the example gave that key,
    in another order; lengths permuted over rows; weights moved with their values."""
    q = list(kjt_query(3, B, VOCABS, NNZ, weighted=True))
    plan = BatchPlan(q, kjt_spec(weighted=True))
    p = perturbed(q, plan.kinds, jagged=plan.jagged)
    old, new = q[2].view(3, B), p[2].view(3, B)
    assert torch.equal(old.sum(1), new.sum(1)) and not torch.equal(old, new)
    for f, (a, b) in enumerate(zip(old.sum(1).cumsum(0) - old.sum(1), old.sum(1).cumsum(0))):
        assert sorted(q[1][a:b].tolist()) == sorted(p[1][a:b].tolist())
        assert max(p[1][a:b].tolist(), default=0) < VOCABS[f]
    assert not torch.equal(q[1], p[1])
    pairs = dict(zip(q[3].tolist(), q[1].tolist()))  # weights are distinct floats
    assert all(pairs[w] == v for w, v in zip(p[3].tolist(), p[1].tolist()))


class RowMajor(nn.Module):
    """Reads its jagged feature row-major (row 0's keys, then row 1's ...): batching it
    key-major is wrong, and the eager check must say so."""

    def __init__(self, keys=2, dim=4):
        super().__init__()
        self.keys = keys
        self.bag = nn.EmbeddingBag(VOCAB, dim, mode="sum")

    def forward(self, dense, values, lengths):
        offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])[:-1]
        return torch.cat([dense, self.bag(values, offsets).view(dense.shape[0], -1)], 1)


def test_check_spec_refuses_a_row_major_model_declared_key_major():
    q = list(kjt_query(4, B, [VOCAB, VOCAB], NNZ))
    torch.manual_seed(0)
    with pytest.raises(SpecRefused, match="batching changes output 0"):
        BatchSetup(RowMajor().eval(), tuple(q), "cpu", kjt_spec())


def test_check_spec_refuses_jagged_inputs_declared_as_plain_rows():
    """Concatenating a KJT blindly (values and lengths query after query) is wrong: the
    check refuses it."""
    torch.manual_seed(0)
    for vocabs in ([VOCAB] * 3, VOCABS):
        m = KJTNet(vocabs).eval()
        with pytest.raises(SpecRefused, match="batching changes output 0"):
            BatchSetup(m, kjt_query(5, B, vocabs, NNZ), "cpu", ["rows", "rows", "rows"])


def test_check_spec_refuses_a_spec_the_model_fails_on():
    class EightRows(nn.Module):  # takes 8 rows and no other count
        def forward(self, dense, values, lengths):
            return dense + torch.ones(8, 1) * lengths.view(-1, 8).sum(0)[:, None]

    q = kjt_query(6, B, VOCABS, NNZ)
    with pytest.raises(SpecRefused, match="the model fails on the batch of two queries: RuntimeError"):
        BatchSetup(EightRows(), q, "cpu", kjt_spec())


# ---------------------------------------------------------------------- served on the CPU

def serve_many(model, qs, kinds, threads=12, per_thread=10, max_batch=8):
    """Every query of ``qs`` from its own client thread, ``per_thread`` times, through a
    batcher over two real CPU workers; returns the max abs error against the model run
    alone on each query, the number of results and the batch sizes."""
    s = BatchSetup(model, qs[0], "cpu", kinds)
    with torch.no_grad():
        ref = [model(*q) for q in qs]
    b = Batcher([CpuWorker(s, max_batch) for _ in range(2)], max_batch=max_batch, max_queue=64)
    errs: list[float] = []

    def client(k):
        for _ in range(per_thread):
            errs.append(float((b.call(tensors(qs[k % len(qs)])) - ref[k % len(qs)]).abs().max()))

    ths = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60)
    b.close()
    assert not any(th.is_alive() for th in ths)
    return max(errs), len(errs), b.stats.sizes()


def test_embedding_bag_include_last_offset_served_batched():
    torch.manual_seed(0)
    m = BagTotal(VOCAB).eval()
    qs = [bag_total_query(10 + k, B, VOCAB) for k in range(12)]
    err, n, sizes = serve_many(m, qs, None)
    assert n == 120 and err <= 1e-5 and max(sizes) > 1


@pytest.mark.parametrize("as_offsets,weighted", [(False, False), (True, False), (False, True), (True, True)])
def test_kjt_model_served_batched(as_offsets, weighted):
    torch.manual_seed(0)
    m = KJTNet(VOCABS, as_offsets=as_offsets, weighted=weighted).eval()
    qs = [kjt_query(20 + k, B, VOCABS, NNZ, as_offsets, weighted) for k in range(12)]
    err, n, sizes = serve_many(m, qs, kjt_spec(as_offsets, weighted))
    assert n == 120 and err <= 1e-5 and max(sizes) > 1


def test_kjt_query_with_another_values_count_fails_alone():
    """Straight to the batcher (the served model never hands it one: its element total
    differs from the example's, so it is served unbatched), a query with more or fewer
    values than the example gets its own error from the staging copy; the rest of its
    batch is served right."""
    torch.manual_seed(0)
    m = KJTNet(VOCABS).eval()
    s = BatchSetup(m, kjt_query(0, B, VOCABS, NNZ), "cpu", kjt_spec())
    b = Batcher([CpuWorker(s, 4)], max_batch=4, max_queue=16, max_delay_s=2.0)
    good = [kjt_query(31, B, VOCABS, NNZ), kjt_query(32, B, VOCABS, NNZ)]
    odd = [kjt_query(33, B, VOCABS, NNZ + 3), kjt_query(34, B, VOCABS, NNZ - 3)]
    futs = [b.submit(tensors(q)) for q in (good[0], odd[0], odd[1], good[1])]
    for f in futs[1:3]:
        with pytest.raises(RuntimeError):
            f.result(10)
    with torch.no_grad():
        for f, q in zip((futs[0], futs[3]), good):
            assert (f.result(10) - m(*q)).abs().max() <= 1e-5
    b.close()
    assert b.stats.sizes() == {2: 1}
