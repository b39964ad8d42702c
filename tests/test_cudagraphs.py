"""A hot block under CUDA graphs (mode="reduce-overhead" on a GPU worker).

A training step updates its inputs in place (parameters, optimizer state); gt declares those
inputs static so that inductor's CUDA graph trees keep them instead of skipping graphs, and
reports whether graphs were used and why not. The graph analysis and the reporting are tested
here on the CPU; the gpu-marked tests train on a CUDA worker against CPU eager.
"""

import functools
import logging
import threading
import time

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from conftest import assert_close
from models import TRANSFORMER, mlp

import gt_core
from gt_core import events as ev
from gt_core.compile.lower import cudagraph_skips, mutated_inputs, replay_here
from gt_core.hotpath import compiling as _compiling
from gt_jupyter._render import status_html, to_text
from gt_jupyter._tables import reason_rows

aten = torch.ops.aten
GRAPHS: list = []


@torch._dynamo.register_backend
def gt_keep_graph(gm, example_inputs):
    GRAPHS.append((gm, [tuple(t.shape) for t in example_inputs]))
    return gm.forward


def test_mutated_inputs_follow_views_lists_and_keywords():
    g = fx.Graph()
    p, buf, x, w, q = (g.placeholder(n) for n in ("p", "buf", "x", "w", "q"))
    y = g.call_function(aten.mm.default, (x, w))  # read only
    g.call_function(aten.mul_.Tensor, (buf, 0.9))  # in place
    flat = g.call_function(aten.view.default, (p, [-1]))
    g.call_function(aten.add_.Tensor, (flat, 1.0))  # in place through a view
    parts = g.call_function(aten.split.Tensor, (q, 1))
    first = g.call_function(__import__("operator").getitem, (parts, 0))
    g.call_function(aten.zero_.default, (first,))  # through an item of a split
    g.output((y,))
    assert mutated_inputs(fx.GraphModule(torch.nn.Module(), g)) == [0, 1, 4]

    g = fx.Graph()
    a, b, c = (g.placeholder(n) for n in ("a", "b", "c"))
    g.call_function(aten._foreach_add_.List, ([a, c], [b, b]))
    g.output(())
    assert mutated_inputs(fx.GraphModule(torch.nn.Module(), g)) == [0, 2]


def test_an_sgd_momentum_step_mutates_its_parameters_and_buffers_only(inprocess):
    GRAPHS.clear()
    gt_core.configure(auto_compile=True, backend="gt_keep_graph", background=False, threshold=3)
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        for _ in range(8):
            F.mse_loss(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        model[0].weight.cpu()
    ((gm, shapes),) = GRAPHS
    mutated = [shapes[k] for k in mutated_inputs(gm)]
    # the 4 parameters and their 4 momentum buffers (the "8 instances" inductor skipped for)
    assert sorted(mutated) == sorted([(64, 32), (64,), (4, 64), (4,)] * 2)
    assert (16, 32) in shapes and (16, 32) not in mutated


def test_cudagraph_skips_takes_this_threads_reasons_and_counted_ones():
    from torch._dynamo.utils import counters

    log = logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")
    seen = []
    other = threading.Thread(target=lambda: log.warning("skipping cudagraphs due to elsewhere"))
    with cudagraph_skips() as reasons:
        log.warning("skipping cudagraphs due to mutated inputs (2 instances)")
        counters["inductor"]["cudagraph_skips"] += 2  # one logged, one only counted
        catch = logging.Handler()
        catch.emit = lambda r: seen.append(r.getMessage())
        log.addHandler(catch)
        other.start(), other.join()
        log.removeHandler(catch)
    assert reasons == [
        "skipping cudagraphs due to mutated inputs (2 instances)",
        "skipped, no reason logged (counters['inductor']['cudagraph_skips'])",
    ]
    assert seen == ["skipping cudagraphs due to elsewhere"]  # another thread's record passes


def test_cuda_graph_trees_state_is_made_in_the_thread_that_replays():
    """Their module, first imported by a compile thread, sets up only that thread."""
    seen = []

    def replaying_thread():
        before = torch._C._is_key_in_tls("tree_manager_containers")
        replay_here()
        seen.extend([before, torch._C._is_key_in_tls("tree_manager_containers")])
        from torch._inductor import cudagraph_trees

        cudagraph_trees.get_container(0)  # what the first replay asks for (asserted there)

    t = threading.Thread(target=replaying_thread)
    t.start(), t.join()
    assert seen == [False, True]


@pytest.mark.inductor
def test_a_skip_is_reported_with_its_reason_where_graphs_were_asked_for(inprocess, monkeypatch):
    """On the CPU inductor skips CUDA graphs; the engine, told graphs apply, reports it.

    (Inductor only counts a CPU skip; a logged reason is taken as the test above shows.)
    """
    monkeypatch.setattr(_compiling, "uses_cudagraphs", lambda mode, device: True)
    gt_core.configure(
        auto_compile=True, backend="inductor", mode="reduce-overhead", background=False, threshold=3
    )
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        x = torch.randn(16, 32)
        for _ in range(12):
            model(x).sum().cpu()
    (done,) = [e for e in gt_core.report().to_data()["events"] if e["type"] == ev.COMPILE_FINISHED]
    assert done["cudagraphs"] == "skipped"
    assert done["cudagraph_skips"] == [
        "skipped, no reason logged (counters['inductor']['cudagraph_skips'])"
    ]
    data = gt_core.report().to_data()
    (p,) = [p for p in data["hot_paths"] if p["status"] == "compiled"]
    assert p["cudagraphs"] == "skipped" and p["cudagraph_skips"] == done["cudagraph_skips"]
    assert "cudagraphs skipped: skipped, no reason logged" in str(gt_core.report())
    (row,) = [r for r in reason_rows(data) if r["kind"] == "cudagraphs skipped"]
    assert row["where"] == p["signature"] and "on CPU" in row["what to do"]
    assert "CUDA graphs skipped" in to_text(data) and ">CUDA graphs</th>" in status_html(data)


# -- on a GPU --------------------------------------------------------------------------------
@pytest.fixture
def cuda_graphs():
    gt_core.worker().stop()
    gt_core.configure(
        worker="inprocess",
        device="cuda",
        auto_compile=True,
        backend="inductor",
        mode="reduce-overhead",
        background=False,
        threshold=3,
        regression_samples=10_000,
    )
    gt_core.reset()
    yield
    gt_core.worker().stop()


def _train(make_model, make_opt, data, loss_fn, steps, on_worker):
    """Losses kept as tensors (read after the loop: no output may be overwritten by a replay).

    Eager runs on the GPU too: the worker draws its random numbers (initial weights, data)
    from the CUDA generator, as eager code on that device does.
    """
    with gt_core.capture() if on_worker else torch.device("cuda"):
        torch.manual_seed(0)
        model = make_model()
        opt = make_opt(model.parameters())
        x, y = data()
        losses = []
        for _ in range(steps):
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        values = [float(v.cpu()) for v in losses]
    return model, values


WORKLOADS = {
    "mlp-sgd-momentum": (
        mlp,
        functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
        lambda: (torch.randn(16, 32), torch.randn(16, 4)),
        F.mse_loss,
    ),
    "mlp-adam": (
        mlp,
        functools.partial(torch.optim.Adam, lr=1e-2),
        lambda: (torch.randn(16, 32), torch.randn(16, 4)),
        F.mse_loss,
    ),
    "transformer": tuple(TRANSFORMER.values()),
}


@pytest.mark.parametrize("workload", list(WORKLOADS))
@pytest.mark.usefixtures("cuda_graphs")
@pytest.mark.gpu
@pytest.mark.inductor
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_training_step_runs_under_cuda_graphs_and_equals_eager(workload):
    ref, ref_losses = _train(*WORKLOADS[workload], steps=14, on_worker=False)
    got, got_losses = _train(*WORKLOADS[workload], steps=14, on_worker=True)
    assert gt_core.worker().device == "cuda"
    assert got_losses == pytest.approx(ref_losses, rel=1e-4, abs=1e-5)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b.cpu(), atol=1e-4, rtol=1e-4)
    (p,) = [p for p in gt_core.report().to_data()["hot_paths"] if p["compiled_runs"]]
    assert p["cudagraphs"] == "used", p["cudagraph_skips"]
    assert p["compiled_runs"] >= 5 and not p["recompile_reasons"]


@pytest.mark.gpu
@pytest.mark.inductor
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_defaults_on_a_gpu_spawned_worker_compile_in_the_background_under_cuda_graphs():
    """What a notebook gets: a spawned worker, background compiles, CUDA graphs replayed in
    the worker's main thread though compiled in another; eager runs meanwhile."""
    gt_core.worker().stop()
    gt_core.configure(
        worker="process", device="cuda", auto_compile=True, backend="inductor",
        mode="reduce-overhead", background=True, threshold=3, regression_samples=10_000,
    )  # fmt: skip
    gt_core.reset()

    def train(on_worker, steps=None):
        with gt_core.capture() if on_worker else torch.device("cuda"):
            torch.manual_seed(0)
            model = mlp()
            opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            x, y = torch.randn(16, 32), torch.randn(16, 4)
            losses, t0 = [], time.monotonic()
            for i in range(steps or 100_000):
                loss = F.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
                if steps is None and i % 50 == 49:
                    loss.item()  # now and then: the worker's events arrive
                    runs = [p["compiled_runs"] for p in gt_core.report().to_data()["hot_paths"]]
                    if max(runs, default=0) >= 20 or time.monotonic() - t0 > 120:
                        break
            return [float(v.cpu()) for v in losses]

    try:
        got = train(on_worker=True)
        ref = train(on_worker=False, steps=len(got))
        (p,) = [p for p in gt_core.report().to_data()["hot_paths"] if p["compiled_runs"]]
        assert p["cudagraphs"] == "used" and p["compiled_runs"] >= 20, p
        assert p["eager_runs"] >= 2  # the steps before the compile landed ran eagerly
        assert got == pytest.approx(ref, rel=1e-4, abs=1e-5)
    finally:
        gt_core.worker().stop()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("worker", ["inprocess", "process"])
def test_seeds_reach_a_cuda_worker_as_in_eager(worker):
    """torch.manual_seed in a capture seeds the worker's CUDA generator: same draws as eager."""
    gt_core.worker().stop()
    gt_core.configure(worker=worker, device="cuda", auto_compile=False)
    gt_core.reset()
    try:
        with gt_core.capture():
            draws = []
            for _ in range(2):
                torch.manual_seed(0)
                draws.append((mlp()[0].weight.cpu(), torch.randn(16, 32).cpu()))
        with torch.device("cuda"):
            torch.manual_seed(0)
            want = (mlp()[0].weight.cpu(), torch.randn(16, 32).cpu())
        for got in draws:
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b)
    finally:
        gt_core.worker().stop()
