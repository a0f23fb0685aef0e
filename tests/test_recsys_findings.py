"""Part C of issue 23 on the shared traces: kernel labels that keep the culprit's name,
embedding-bound, optimizer-unfused, input-stall and the kernel-mix notes. Every expected
number is computed here from the trace itself (SQL over the nsys export, arithmetic over
the Kineto JSON), not copied from the analyzers' output."""

from __future__ import annotations

import gzip
import io
import json
import sqlite3

import pytest

from recsys_doctor.reports._common import kernel_label, kernel_labels

pytestmark = pytest.mark.shared


def _db(path):
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _kernel_names(path) -> list[str]:
    return [n for (n,) in _db(path).execute(
        """select s.value from CUPTI_ACTIVITY_KIND_KERNEL k join StringIds s on s.id = k.demangledName
           group by s.value order by count(*) desc""")]


def test_labels_keep_the_operator_name(shared_traces):
    names = _kernel_names(shared_traces / "h100" / "wdl_serial_q4_h100.sqlite")
    labels = kernel_labels(names)
    assert len(set(labels.values())) == len(names)  # unique within the report
    top = names[0]  # the most launched kernel, by SQL
    assert "EmbeddingBag_updateOutputKernel_sum_mean" in top
    assert labels[top] == "EmbeddingBag_updateOutputKernel_sum_mean"
    cat = next(n for n in names if "CatArrayBatchedCopy" in n)
    assert labels[cat].startswith("CatArrayBatchedCopy")
    add = next(n for n in names if "vectorized_elementwise_kernel" in n and "CUDAFunctor_add" in n)
    clamp = next(n for n in names if "vectorized_elementwise_kernel" in n and "clamp" in n)
    assert labels[add] == "vectorized_elementwise_kernel<add>"
    assert labels[clamp] == "vectorized_elementwise_kernel<clamp>"
    for n in names:
        assert labels[n] != "native" and not labels[n].startswith("<")


def test_kineto_names_keep_the_operator_name(shared_traces):
    with gzip.open(shared_traces / "h100" / "mmoe_4streams_h100.pt.trace.json.gz") as fh:
        ev = json.load(fh)["traceEvents"]
    names = sorted({e["name"] for e in ev if e.get("cat") == "kernel"})
    labels = kernel_labels(names)
    assert len(set(labels.values())) == len(names)
    lerp = next(n for n in names if "multi_tensor_apply_kernel" in n and "LerpFunctor" in n)
    assert labels[lerp] == "multi_tensor_apply_kernel<LerpFunctor>"
    emb = next(n for n in names if "embedding_backward_feature_kernel" in n)
    assert labels[emb] == "embedding_backward_feature_kernel"


def test_colliding_labels_are_told_apart():
    a = "void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(x)::{lambda(float)#1}>(int, T3)"
    b = "void at::native::elementwise_kernel<128, 2, at::native::direct_copy_kernel_cuda(x)::{lambda(long)#1}>(int, T3)"
    assert kernel_label(a) == kernel_label(b) == "elementwise_kernel<direct_copy>"
    got = kernel_labels([a, b, a])
    assert got == {a: "elementwise_kernel<direct_copy>[float]", b: "elementwise_kernel<direct_copy>[long]"}
    c = "void foo<1>(int)"
    d = "void foo<2>(int)"
    assert kernel_labels([c, d]) == {c: "foo", d: "foo#2"}
