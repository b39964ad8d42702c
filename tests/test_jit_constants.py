"""Tensors a jitted step makes from host data: frozen into its block when equal on the
recorded calls, refused (naming the line) when they differ or are written in place."""

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from models import mlp

import gt_core


def _train(on_worker, make_extra, steps=10, jit=True):
    with gt_core.capture() if on_worker else _nothing():
        torch.manual_seed(0)
        model = mlp(16, 32, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        calls = [0]

        def step(x, y):
            calls[0] += 1
            scale = make_extra(calls[0])  # a tensor made from host data inside the step
            loss = F.mse_loss(model(x) * scale, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        fn = gt_core.jit(step) if on_worker and jit else step
        losses = [fn(x, y) for _ in range(steps)]
        losses = [v.item() for v in losses]
        params = [
            p.detach().cpu() if gt_core.is_remote(p) else p.detach() for p in model.parameters()
        ]
    return losses, params, fn


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _entry(fn):
    (e,) = fn.entries.values()
    return e


def test_a_constant_made_inside_the_step_is_frozen_and_replayed(inprocess):
    gt_core.configure(auto_compile=True, backend="eager")
    make = lambda n: torch.tensor([1.0, 0.5, 2.0, 1.5])  # noqa: E731
    want, want_params, _ = _train(False, make)
    got, params, fn = _train(True, make)
    assert got == pytest.approx(want, abs=1e-6)
    for a, b in zip(params, want_params, strict=True):
        assert_close(a, b)
    e = _entry(fn)
    assert e.refused is None and e.replayed >= 6
    (replaying,) = [
        x for x in gt_core.report().events if x["type"] == "jit" and x.get("trigger") == "prepared"
    ]
    (c,) = replaying["constants"]
    assert c["shape"] == [4] and c["dtype"] == "float32" and "test_jit_constants.py" in c["where"]


def test_data_made_inside_the_step_refuses_replay_naming_its_line(inprocess):
    gt_core.configure(auto_compile=True, backend="eager")
    make = lambda n: torch.tensor([1.0, 0.5, 2.0, float(n)])  # noqa: E731 (changes each call)
    want, want_params, _ = _train(False, make)
    got, params, fn = _train(True, make)
    assert got == pytest.approx(want, abs=1e-6)  # the function ran: eager's results
    for a, b in zip(params, want_params, strict=True):
        assert_close(a, b)
    e = _entry(fn)
    assert e.replayed == 0 and "changes between calls" in e.refused
    assert "test_jit_constants.py:" in e.refused and "pass it as an argument" in e.refused


def test_a_constant_written_in_place_refuses_replay(inprocess):
    gt_core.configure(auto_compile=True, backend="eager")

    def make(n):
        t = torch.tensor([1.0, 0.5, 2.0, 1.5])
        return t.mul_(torch.ones(4))  # (written on the worker: a reused one would be written again)

    want, _, _ = _train(False, make)
    got, _, fn = _train(True, make)
    assert got == pytest.approx(want, abs=1e-6)
    e = _entry(fn)
    assert e.replayed == 0 and "writes it in place" in e.refused


def _scaled_training(on_worker: bool, read):
    """A small tensor made in the capture, outside the step, and changed between calls (a
    scale the loop halves once the step replays); the step reads its value as a number
    (``read``)."""
    with gt_core.capture() if on_worker else _nothing():
        torch.manual_seed(0)
        model = mlp(16, 32, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        scale = torch.tensor(1.0)

        def step(x, y):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    read(p, scale)
            opt.zero_grad()
            return loss

        fn = gt_core.jit(step) if on_worker else step
        losses = []
        for i in range(10):
            losses.append(fn(x, y))
            scale.fill_(1.0 if i < 6 else 0.5)  # (after the audited first replay)
        losses = [v.item() for v in losses]
    return losses, fn


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda p, s: p.add_(p.grad, alpha=-0.05 * s.item()), id="item"),
        pytest.param(lambda p, s: p.add_(p.grad, alpha=-s), id="alpha=tensor"),
    ],
)
def test_a_small_tensor_read_as_a_number_in_the_step_is_never_replayed_stale(inprocess, read):
    """Its value is answered from the client's shadow (no sync), so the recorded call has
    no sync to refuse, and the number it gives is frozen into the block. Each replay reads
    it again (jit.program) and compares: when the tensor changed, the call records again,
    naming the read, and replay resumes with the new number."""
    gt_core.configure(auto_compile=True, backend="eager")
    want, _ = _scaled_training(False, read)
    got, fn = _scaled_training(True, read)
    assert got == want  # (bit for bit: the optimizer and the read as eager ran them)
    e = _entry(fn)
    assert e.replayed >= 3 and e.reason.kind == "value_changed", e.reason
    assert (e.reason.old, e.reason.new) in ((1.0, 0.5), (-1.0, -0.5)), e.reason


def test_a_read_that_cannot_be_repeated_refuses_replay_naming_it(inprocess):
    """An int read from a small tensor (a count used in Python) is no number jit can
    recompute: the call is never replayed, and the reason says why."""
    gt_core.configure(auto_compile=True, backend="eager")
    read = lambda p, s: p.add_(p.grad, alpha=-0.05 * (1 + s.int().item()))  # noqa: E731
    want, _ = _scaled_training(False, read)
    got, fn = _scaled_training(True, read)
    assert got == want
    e = _entry(fn)
    assert e.replayed == 0 and e.reason.kind == "value_read", e.reason
    assert "int read from a tensor" in e.reason.text()
