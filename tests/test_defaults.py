"""torch.set_default_dtype in the kernel holds on the worker: a capture's factories, integer
tensors with Python floats, and compiled blocks follow it, as in eager. (A spawned worker has
torch's own float32: it made float32 values that the client called float64.)"""

import pytest
import torch
from conftest import assert_close

import gt_core


def _made():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)  # (its initial weights: draws scaled in the default dtype)
    return [
        torch.randn(3),
        torch.tensor([1.1, 2.2]),
        torch.arange(3.0) / 3,
        torch.arange(3) * 0.1,  # an integer tensor with a Python float
        torch.ones(2) * 0.1,
        torch.full((2,), 1) / 3,
        lin.weight,
        lin(torch.ones(3)),
    ]


def _same(got, want):
    for g, w in zip(got, want, strict=True):
        g = g.detach().cpu() if gt_core.is_remote(g) else g.detach()
        assert g.dtype == w.dtype and torch.equal(g, w.detach()), (g, w)


@pytest.fixture
def float64():
    was = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(was)


@pytest.mark.parametrize("worker", ["inprocess", "process"])
def test_a_default_dtype_set_before_the_capture_is_the_workers(request, worker, float64):
    request.getfixturevalue(worker)
    want = _made()
    with gt_core.capture():
        got = _made()
    _same(got, want)


def test_every_rank_of_a_group_takes_the_default_dtype(group, float64):
    """Rank 0 answers; every rank runs the stream, each with the kernel's default dtype (a
    rank's float32 draws would part it from the others: values read whole are rank 0's)."""
    want = _made()
    with gt_core.capture(workers=2, shard={"batch": 0}):
        with gt_core.signal.context("batch"):
            x = torch.ones(4, 3) / 3
        got = [*_made(), x * 0.1]
        total = (x * 0.1).sum().cpu()  # (summed by halves: rounding apart from eager's)
    _same(got, [*want, torch.ones(4, 3) / 3 * 0.1])
    assert total.dtype == torch.float64
    assert_close(total, (torch.ones(4, 3) / 3 * 0.1).sum(), atol=1e-15, rtol=1e-15)


@pytest.mark.parametrize("worker", ["inprocess", "process"])
def test_a_default_dtype_set_inside_a_capture_holds_from_there_on(request, worker):
    request.getfixturevalue(worker)

    def both():
        a = torch.ones(2) / 3
        torch.set_default_dtype(torch.float64)
        try:
            return [a, *_made()]
        finally:
            torch.set_default_dtype(torch.float32)

    want = both()
    with gt_core.capture():
        got = both()
        after = torch.ones(2) / 3  # float32 again
    _same(got, want)
    assert after.dtype == torch.float32 and torch.equal(after.cpu(), torch.ones(2) / 3)


@pytest.mark.inductor
def test_a_compiled_block_under_a_float64_default_equals_eager(inprocess, float64):
    """The compile process compiles a block with the worker's default dtype: a factory in the
    step (no dtype) and an integer tensor scaled by a Python float compile to float64."""
    gt_core.configure(auto_compile=True, backend="inductor", background=False, threshold=3)

    def steps(n):
        torch.manual_seed(0)
        w = torch.randn(8, requires_grad=True)
        out = []
        for _ in range(n):
            bias = torch.zeros(8) + torch.arange(8) * 0.1
            loss = ((w + bias) ** 2).sum()
            loss.backward()
            with torch.no_grad():
                w -= 0.01 * w.grad
                w.grad = None
            out.append(loss.detach())
        return [w.detach(), *out]

    want = steps(12)
    with gt_core.capture():
        got = [t.cpu() for t in steps(12)]
    hot = gt_core.report().to_data()["hot_paths"]
    assert any(str(h["status"]).endswith("compiled") for h in hot), hot
    for g, w in zip(got, want, strict=True):
        assert g.dtype == torch.float64
        assert_close(g, w, atol=1e-12, rtol=1e-12)
