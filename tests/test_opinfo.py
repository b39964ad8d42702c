"""PyTorch's OpInfo samples through the worker process: a fixed set of representative ops.

Each sample equals eager (the rules are in tests/_opinfo.py) or is a listed failure with its
reason. benchmarks/opinfo.py runs every OpInfo the same way.
"""

import functools

import pytest
import torch
from conftest import assert_close

import gt_core

pytest.importorskip("expecttest", reason="PyTorch's OpInfo helpers import expecttest")

import _opinfo  # noqa: E402

OPS = [
    # pointwise, with broadcasting, scalars and type promotion
    ("add", ""),
    ("mul", ""),
    ("div", "no_rounding_mode"),
    ("pow", ""),
    ("sigmoid", ""),
    ("where", ""),
    ("clamp", ""),
    ("lerp", ""),
    # reductions and scans
    ("sum", ""),
    ("mean", ""),
    ("var", ""),
    ("amax", ""),
    ("argmax", ""),
    ("cumsum", ""),
    ("max", "reduction_with_dim"),
    ("sort", ""),
    ("topk", ""),
    # views and layout
    ("reshape", ""),
    ("permute", ""),
    ("transpose", ""),
    ("narrow", ""),
    ("diagonal", ""),
    ("as_strided", ""),
    ("chunk", ""),
    ("unbind", ""),
    ("cat", ""),
    ("stack", ""),
    ("tensor_split", ""),
    # indexing, data-dependent shapes (sync ops)
    ("index_select", ""),
    ("gather", ""),
    ("scatter_add", ""),
    ("index_put", ""),
    ("masked_fill", ""),
    ("masked_select", ""),
    ("nonzero", ""),
    ("unique", ""),
    # linear algebra, nn, fft (complex results), random, undefined values, sparse
    ("matmul", ""),
    ("addmm", ""),
    ("linalg.solve", ""),
    ("nn.functional.conv2d", ""),
    ("nn.functional.layer_norm", ""),
    ("nn.functional.cross_entropy", ""),
    ("nn.functional.embedding", ""),
    ("nn.functional.pad", "circular"),
    ("nn.functional.linear_cross_entropy", "chunked"),  # an op torch registers lazily
    ("softmax", ""),
    ("fft.ifft", ""),
    ("fft.rfft", ""),
    ("conj_physical", ""),
    ("normal", ""),
    ("bernoulli", ""),
    ("nn.functional.dropout", ""),
    ("empty_like", ""),
    ("to_sparse", ""),
]

LIMIT = 20  # samples per op: the whole set stays well under a minute

TENSOR_INDICES = (
    "tensor_split with a tensor of indices reads the tensor's data in C++ before dispatch "
    "(a proxy holds none)"
)
SPARSE = "worker tensors are dense (strided) only"
# (op, sample index) -> (outcome, a part of its detail, the reason)
EXPECTED = {
    ("tensor_split", 0): (_opinfo.GT_ERROR, "not allocated", TENSOR_INDICES),
    ("tensor_split", 2): (_opinfo.GT_ERROR, "not allocated", TENSOR_INDICES),
    ("tensor_split", 3): (_opinfo.GT_ERROR, "not allocated", TENSOR_INDICES),
    ("to_sparse", 0): (_opinfo.GT_ERROR, SPARSE, SPARSE),
    ("to_sparse", 1): (_opinfo.GT_ERROR, SPARSE, SPARSE),
}


@functools.cache
def _db() -> dict:
    return {(o.name, o.variant_test_name): o for o in _opinfo.op_db()}


@pytest.mark.parametrize("name,variant", OPS, ids=[f"{n}.{v}" if v else n for n, v in OPS])
def test_opinfo_samples_equal_eager(process, name, variant):
    pid = process.pid
    outcomes = _opinfo.run_op(_db()[(name, variant)], limit=LIMIT)
    assert outcomes, f"{name} has no float32 CPU samples"
    wrong = []
    for o in outcomes:
        key = (name, o.index)
        if key in EXPECTED:
            kind, part, _reason = EXPECTED[key]
            if o.kind != kind or part not in o.detail:
                wrong.append(f"#{o.index} expected {kind} ({part}), got {o.kind}: {o.detail}")
        elif o.kind not in _opinfo.PASSED:
            wrong.append(f"#{o.index} {o.kind}: {o.detail}")
    assert not wrong, f"{name}: " + "\n".join(wrong)
    assert process.pid == pid  # no sample killed the worker


# The bugs the sweep found, each alone.
def test_conjugate_views_cross_the_pipe_with_their_values(process):
    z = torch.randn(4, dtype=torch.complex64)
    with gt_core.capture():
        w = gt_core.to_worker(z.conj())  # uploaded with its conjugate bit
        assert_close(w, z.conj())
        assert_close(torch.fft.ifft(gt_core.to_worker(z.real.clone())), torch.fft.ifft(z.real))
        assert_close(w.conj(), z)  # fetched from a lazy conjugate view on the worker


def test_empty_view_with_an_offset(inprocess):
    x = torch.randn(2, 3, 3)
    with gt_core.capture():
        w = gt_core.to_worker(x)
        v = w[1:, :0]  # empty, storage offset 9
        out = torch.nn.functional.pad(v, (1, 2), "circular")
        assert out.shape == torch.nn.functional.pad(x[1:, :0], (1, 2), "circular").shape
        assert_close(w[1:].sum(), x[1:].sum())


def test_a_sparse_result_is_refused_clearly(process):
    with gt_core.capture():
        w = gt_core.to_worker(torch.eye(3))
        with pytest.raises(gt_core.UnsupportedOperation, match="dense"):
            w.to_sparse()
        assert_close(w.sum(), torch.tensor(3.0))
