"""A worker group's collectives per step, counted where they run (gt_core.worker_process.comms): a
known case, the gradients' all-reduces of a batch-sharded MLP step, against what the
parameter sizes say; and a replicated group, which runs none per step."""

import contextlib

import torch
import torch.nn.functional as F

import gt_core
from gt_bench.workloads import mlp, training_step
from gt_jupyter._render import to_html

STEPS = 12


def _sum_of_squares(o, y):
    return ((o - y) ** 2).sum()


def _train(shard: bool, loss_fn=_sum_of_squares, workers: int = 2):
    options = {"shard": {"batch": 0}} if shard else {}
    with gt_core.capture(workers=workers, **options) if workers else contextlib.nullcontext():
        torch.manual_seed(0)
        model = mlp(32, 16, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with gt_core.signal.context("batch"):
            x, y = torch.randn(32, 32), torch.randn(32, 4)
        step = training_step(model, opt, loss_fn)
        for _ in range(STEPS):
            loss = step(x, y)
        last = loss.item()
        params = [p.detach().cpu() for p in model.parameters()]
        if workers:
            gt_core.wait()
    return model, last, params


def test_a_sharded_steps_collectives_are_its_gradients_all_reduces(group):
    """The batch sharded on axis 0: each parameter's gradient is a partial sum on each rank,
    all-reduced once per step where SGD adds it to the whole parameter; a loss that DTensor
    reduces itself (a sum) adds none. So a step is one all-reduce per parameter, of its
    bytes, on each rank, and nothing else."""
    torch.manual_seed(0)
    want_model = mlp(32, 16, 4)
    model, _, _ = _train(shard=True)
    params = list(model.parameters())
    for g, w in zip(params, want_model.parameters(), strict=True):
        assert g.shape == w.shape
    nbytes = sum(p.numel() * p.element_size() for p in params)
    data = gt_core.report().to_data()
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    for r in data["ranks"]:
        assert r["comm_per_step"] == {"all_reduce": {"count": len(params), "bytes": nbytes}}, r
        assert r["collectives_per_step"] == len(params) and r["bytes_per_step"] == nbytes
        assert r["compiled_runs"] > 0  # (the step counted is the compiled block's)
        # so far: the steps', gt's agreements (4-byte all-reduces) and the fetches'
        assert r["comm"]["all_reduce"]["count"] >= STEPS * len(params)
        assert r["collectives"] == sum(k["count"] for k in r["comm"].values())
    text = str(gt_core.report())
    assert f"collectives per step {len(params)} (all_reduce {len(params)})" in text, text
    kb = f"{nbytes / 1e3:.1f} KB"
    assert f"{kb} (all_reduce {kb})" in text, text
    html = to_html(data, figures=False)
    assert "bytes/step" in html and f"all_reduce {kb}" in html


def test_a_loss_run_on_whole_values_gives_back_a_gradient_split_like_the_logits(group):
    """``mse_loss`` has no DTensor rule: it and its backward run on whole values (their
    arguments gathered). The gradient the backward gives back is laid out as the logits are,
    split over the batch: so the last bias's gradient is a partial sum all-reduced like the
    others (whole, it needed none, and each rank multiplied the whole batch's gradient into
    the last layer), and every parameter's gradient is one all-reduce per step."""
    _, want_loss, want = _train(shard=False, loss_fn=F.mse_loss, workers=0)
    model, loss, got = _train(shard=True, loss_fn=F.mse_loss)
    assert abs(loss - want_loss) <= 1e-6
    for g, w in zip(got, want, strict=True):
        assert (g - w).abs().max().item() <= 1e-6
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for r in gt_core.report().to_data()["ranks"]:
        assert r["comm_per_step"]["all_reduce"] == {"count": 4, "bytes": nbytes}, r
        assert r["comm_per_step"]["all_gather"]["count"] == 4, r  # (logits and y, twice)


def test_a_replicated_group_runs_no_collective_per_step(group):
    _train(shard=False)
    data = gt_core.report().to_data()
    for r in data["ranks"]:
        assert r["comm_per_step"] == {} and r["bytes_per_step"] == 0, r
        assert r["comm"]["all_reduce"]["count"] >= 2  # gt's agreements (a compile, its check)
    assert "collectives per step 0, 0 B" in str(gt_core.report())
