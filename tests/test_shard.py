"""A worker group that shards the batch (DTensor, 2 gloo ranks, axis 0); eager on one process
is the oracle of every case: losses and reductions swept, an MLP and a transformer trained."""

import contextlib

import pytest
import torch
import torch.nn.functional as F

import gt_core
from gt_bench.workloads import TRANSFORMER, mlp, training_step
from gt_core.client import capture as _capture
from gt_core.observe import events as ev
from gt_jupyter._render import to_html


def _classes(y):
    return y.argmax(1)


# Every loss and reduction of a batch: (output [B, 4], target [B, 4]) -> a 0-d loss.
LOSSES = {
    "mse_loss": lambda o, y: F.mse_loss(o, y),
    "mse_loss sum": lambda o, y: F.mse_loss(o, y, reduction="sum"),
    "mse_loss none .mean()": lambda o, y: F.mse_loss(o, y, reduction="none").mean(),
    "l1_loss": lambda o, y: F.l1_loss(o, y),
    "l1_loss sum": lambda o, y: F.l1_loss(o, y, reduction="sum"),
    "l1_loss none .mean()": lambda o, y: F.l1_loss(o, y, reduction="none").mean(),
    "smooth_l1_loss": lambda o, y: F.smooth_l1_loss(o, y),
    "smooth_l1_loss sum": lambda o, y: F.smooth_l1_loss(o, y, reduction="sum"),
    "smooth_l1_loss none .mean()": lambda o, y: F.smooth_l1_loss(o, y, reduction="none").mean(),
    "huber_loss": lambda o, y: F.huber_loss(o, y, delta=0.5),
    "cross_entropy": lambda o, y: F.cross_entropy(o, _classes(y)),
    "cross_entropy sum": lambda o, y: F.cross_entropy(o, _classes(y), reduction="sum"),
    "cross_entropy none .mean()": lambda o, y: F.cross_entropy(
        o, _classes(y), reduction="none"
    ).mean(),
    "cross_entropy soft targets": lambda o, y: F.cross_entropy(o, y.softmax(1)),
    "nll_loss": lambda o, y: F.nll_loss(o.log_softmax(1), _classes(y)),
    "nll_loss sum": lambda o, y: F.nll_loss(o.log_softmax(1), _classes(y), reduction="sum"),
    "nll_loss none .mean()": lambda o, y: F.nll_loss(
        o.log_softmax(1), _classes(y), reduction="none"
    ).mean(),
    "bce_with_logits": lambda o, y: F.binary_cross_entropy_with_logits(o, y.sigmoid()),
    "bce_with_logits sum": lambda o, y: F.binary_cross_entropy_with_logits(
        o, y.sigmoid(), reduction="sum"
    ),
    "bce_with_logits none .mean()": lambda o, y: F.binary_cross_entropy_with_logits(
        o, y.sigmoid(), reduction="none"
    ).mean(),
    ".mean()": lambda o, y: ((o - y) ** 2).mean(),
    ".sum()": lambda o, y: ((o - y) ** 2).sum(),
    ".mean(0).sum()": lambda o, y: (o - y).abs().mean(0).sum(),
    ".sum(1).mean()": lambda o, y: (o - y).pow(2).sum(1).mean(),
    # A random op on sharded values (DTensor's slices would draw other numbers than eager)
    "dropout, mse_loss": lambda o, y: F.mse_loss(F.dropout(o, 0.5), y),
}

STEPS = 3  # a step recorded and compiled, one checked, one compiled (compile_all)


def _train(loss_fn, sharded: bool):
    """(parameters, losses) after STEPS SGD steps of a small MLP on a batch of 6."""
    torch.manual_seed(0)
    model = mlp(8, 16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gt_core.signal.context("batch") if sharded else contextlib.nullcontext():
        x, y = torch.randn(6, 8), torch.randn(6, 4)
    step = training_step(model, opt, loss_fn)
    losses = [step(x, y).item() for _ in range(STEPS)]
    return [p.detach().cpu() for p in model.parameters()], losses


@pytest.mark.parametrize("compiled", [False, True], ids=["op by op", "compiled"])
def test_every_loss_and_reduction_of_a_sharded_batch_equals_eager(group, compiled):
    """DTensor alone gets some of these wrong (mse_loss, smooth_l1_loss and huber_loss with
    reduction='mean': gradients 2x eager's on 2 ranks): gt must get every one right."""
    want = {name: _train(fn, sharded=False) for name, fn in LOSSES.items()}
    wrong = []
    with gt_core.capture(workers=2, shard={"batch": 0}, compile_all=compiled):
        for name, fn in LOSSES.items():
            got, losses = _train(fn, sharded=True)
            params, eager_losses = want[name]
            if losses != pytest.approx(eager_losses, abs=1e-5):
                wrong.append(f"{name}: losses {losses}, eager {eager_losses}")
            for k, (g, w) in enumerate(zip(got, params, strict=True)):
                diff = (g - w).abs().max().item()
                if diff > 1e-5:
                    wrong.append(f"{name}: parameter {k} differs from eager by {diff:.3g}")
        gt_core.wait()
    assert not wrong, "\n".join(wrong)
    data = gt_core.report().to_data()
    replicated = {e["op"] for e in gt_core.events_log().snapshot() if e["type"] == ev.SHARDED}
    # The case DTensor gets wrong ran replicated, and said so; so did the random op.
    assert "aten.mse_loss_backward.default" in replicated, replicated
    assert "aten.bernoulli_.float" in replicated, replicated
    if compiled:
        assert any(p["status"] == "compiled" for p in data["hot_paths"]), data["hot_paths"]


def _data_of(make_data, sharded: bool):
    with gt_core.signal.context("batch") if sharded else contextlib.nullcontext():
        return make_data()


WORKLOADS = {
    "mlp": (mlp, lambda: (torch.randn(32, 32), torch.randn(32, 4)), F.mse_loss),
    "transformer": (TRANSFORMER["make_model"], TRANSFORMER["make_data"], TRANSFORMER["loss_fn"]),
}


def _run(make_model, make_data, loss_fn, on_group: bool, jit: bool = False, steps: int = 50):
    """(parameters, last loss, x fetched, the jitted function or None) after ``steps``."""
    ctx = gt_core.capture(workers=2, shard={"batch": 0}) if on_group else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        x, y = _data_of(make_data, on_group)
        step = training_step(model, opt, loss_fn)
        fn = gt_core.jit(step) if jit else step
        for _ in range(steps):
            loss = fn(x, y)
        last = loss.item()
        fetched = x.cpu()
    return [p.detach().cpu() for p in model.parameters()], last, fetched, fn if jit else None


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_sharded_training_equals_eager_plain_and_jit_compiled_on_every_rank(group, workload):
    spec = WORKLOADS[workload]
    want, want_loss, want_x, _ = _run(*spec, on_group=False)
    for jit in (False, True):
        gt_core.reset()
        got, got_loss, got_x, fn = _run(*spec, on_group=True, jit=jit)
        assert torch.equal(got_x, want_x)  # a sharded tensor fetched is the whole tensor
        assert got_loss == pytest.approx(want_loss, abs=1e-5)
        for g, e in zip(got, want, strict=True):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=0)
        if jit:
            assert sum(e.replayed for e in fn.entries.values()) > 0
        gt_core.wait()
        data = gt_core.report().to_data()
        compiled = {p["signature"] for p in data["hot_paths"] if p["status"] == "compiled"}
        assert compiled, data["hot_paths"]
        for r in data["ranks"]:  # every rank compiled the hot path and ran it compiled
            assert compiled & set(r["compiled"]), (r, compiled)
            assert r["compiled_runs"] > 0
            assert "Shard(dim=0)" in r["placements"], r  # the batch, sharded
            assert "Replicate()" in r["placements"], r  # the parameters, whole
        assert "Shard(dim=0)" in str(gt_core.report())
        html = to_html(data, figures=False)  # the dashboard: placements, ops run replicated
        assert "Shard(dim=0)" in html and "<b>ran replicated</b>" in html


def test_uploads_and_made_tensors_inside_the_signal_are_halves_fetched_whole(group):
    """A tensor uploaded (torch.tensor, gt_core.to_worker) or made (randn) inside the sharded
    signal takes half its bytes on rank 0; outside it, all of them; fetched, it is whole."""
    data = torch.randn(256, 64)  # 64 KiB
    with gt_core.capture(workers=2, shard={"batch": 0}, auto_compile=False):
        held = gt_core.worker().stats()["bytes"]
        whole = gt_core.to_worker(data)
        assert gt_core.worker().stats()["bytes"] - held == data.nbytes
        with gt_core.signal.context("batch"):
            held = gt_core.worker().stats()["bytes"]
            up = gt_core.to_worker(data)
            assert gt_core.worker().stats()["bytes"] - held == data.nbytes // 2
            torch.manual_seed(3)
            made = torch.randn(256, 64)
            assert gt_core.worker().stats()["bytes"] - held == data.nbytes
            listed = torch.tensor(data.tolist())  # (an upload, then lift_fresh)
        assert torch.equal(up.cpu(), data) and torch.equal(listed.cpu(), data)
        torch.manual_seed(3)
        assert torch.equal(made.cpu(), torch.randn(256, 64))
        # ops mixing the sharded and the whole, reduced over the sharded axis, equal eager
        got = ((up * whole).sum(0) + made.mean()).cpu()
    torch.manual_seed(3)
    want = (data * data).sum(0) + torch.randn(256, 64).mean()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-6)


def test_a_plain_tensor_uploaded_whole_before_the_signal_goes_again_sharded_inside_it(group):
    """A graph made before the signal keeps the host tensor's whole copy for its backward;
    inside the sharded signal the same tensor is uploaded again, as a half, as any upload
    made there (not the whole copy reused)."""
    data = torch.randn(256, 64)  # 64 KiB
    w = torch.randn(64)
    with gt_core.capture(workers=2, shard={"batch": 0}, auto_compile=False) as s:
        ww = gt_core.to_worker(w).requires_grad_()
        before = (data * ww).sum()  # data goes up whole; the graph keeps it for the backward
        sent = s.counters["uploads"]
        with gt_core.signal.context("batch"):
            inside = (data * ww).sum()  # data again, sharded (its graph keeps the half)
        assert s.counters["uploads"] - sent == 1
        (before + inside).backward()
        got = (before.detach().cpu(), inside.detach().cpu(), ww.grad.cpu())
    want = (data * w).sum()
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(got[1], want, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(got[2], 2 * data.sum(0), atol=1e-4, rtol=1e-5)


def test_a_block_compiled_for_a_sharded_batch_runs_a_whole_one_eagerly(group):
    def train(on_group: bool):
        ctx = (
            gt_core.capture(workers=2, shard={"batch": 0}) if on_group else contextlib.nullcontext()
        )
        with ctx:
            torch.manual_seed(0)
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            step = training_step(model, opt, F.mse_loss)
            x, y = torch.randn(32, 32), torch.randn(32, 4)
            with gt_core.signal.context("batch") if on_group else contextlib.nullcontext():
                xs, ys = torch.randn(32, 32), torch.randn(32, 4)
            for k in range(12):  # sharded, compiled; then the same shapes whole
                loss = step(xs, ys) if k < 8 else step(x, y)
            loss.item()
        return [p.detach().cpu() for p in model.parameters()]

    want = train(False)
    got = train(True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    gt_core.wait()
    notes = [e["reason"] for e in gt_core.events_log().snapshot() if e["type"] == ev.NOTE]
    assert any("laid out over the ranks otherwise" in n for n in notes), notes
    data = gt_core.report().to_data()
    assert any(p["status"] == "compiled" for p in data["hot_paths"]), data["hot_paths"]


def test_another_sharding_is_another_group(group):
    with gt_core.capture(workers=2):
        a = torch.ones(4, 2)
        first = _capture.session().transport
    with gt_core.capture(workers=2, shard={"batch": 0}):  # (the ranks' policy is set at start)
        assert _capture.session().transport is not first
        with gt_core.signal.context("batch"):
            b = torch.ones(4, 2)
        assert (b * 2).sum().item() == 16.0
    with pytest.raises(gt_core.WorkerLost):
        a.sum()


def test_a_view_that_cannot_run_sharded_is_an_error_not_a_copy(group):
    """unfold has no DTensor rule: run on the whole tensor it would return a copy, and a
    write through it would be lost; it fails, saying so, and the group goes on."""
    with gt_core.capture(workers=2, shard={"batch": 0}, auto_compile=False):
        with gt_core.signal.context("batch"):
            b = torch.arange(16.0).view(8, 2)
        u = b.unfold(0, 2, 2)
        with pytest.raises(gt_core.UnsupportedOperation, match=r"unfold.* a copy, not a view"):
            u.sum().item()
        assert (b * 2).sum().item() == 240.0
