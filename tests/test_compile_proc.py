"""Inductor compiles in a process of their own (gt_core.compile.process)."""

import os
import pickle
import signal

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from conftest import assert_close
from models import mlp

import gt_core
from gt_core import events as ev
from gt_core.compile.process import CompileProcess, CompileProcessDied
from gt_core.config import from_env


def _events(kind):
    return [e for e in gt_core.report().to_data()["events"] if e["type"] == kind]


def _train(on_worker: bool, before: int = 8, after: int = 6):
    """Adam + cosine schedule (lifted scalars); on the worker, wait for the compile midway."""
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
    x, y = torch.randn(16, 32), torch.randn(16, 4)
    losses = []
    for i in range(before + after):
        if on_worker and i == before:
            gt_core.wait(compiles=True)  # compiled: the next occurrences run compiled
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        losses.append(loss.item())
    return model, losses


def _check_compiled_in_process_and_equal():
    ref, ref_losses = _train(False)
    with gt_core.capture():
        got, losses = _train(True)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b, atol=1e-5)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert [e["where"] for e in _events(ev.COMPILE_STARTED)] == ["process"]
    assert len(_events(ev.COMPILE_FINISHED)) == 1 and not _events(ev.COMPILE_FAILED)


@pytest.fixture
def inductor_background(inprocess):
    gt_core.configure(
        auto_compile=True,
        backend="inductor",
        background=True,
        threshold=3,
        regression_samples=10_000,
    )
    yield
    gt_core.configure(auto_compile=False, backend="eager", regression_samples=5)


@pytest.mark.inductor
def test_block_compiled_in_the_compile_process_equals_eager(inductor_background):
    _check_compiled_in_process_and_equal()
    runs = [e["kind"] for e in _events(ev.ITERATION)]
    assert runs.count("compiled") >= 5  # every occurrence after the wait


@pytest.mark.inductor
def test_spawned_worker_warms_the_compile_process_and_its_blocks_equal_eager(process):
    """The product's path: a worker spawned for inductor imports and warms before serving."""
    gt_core.configure(
        auto_compile=True, backend="inductor", background=True, threshold=3, regression_samples=10_000
    )
    try:
        gt_core.worker().restart()  # spawned with these options: warms at its start
        gt_core.reset()
        _check_compiled_in_process_and_equal()
    finally:
        gt_core.configure(auto_compile=False, backend="eager", regression_samples=5)
        gt_core.worker().restart()


def test_a_closed_compile_process_is_never_started_again():
    """A warm-up cut short by close() asked for the process again: it outlived its worker."""
    cp = CompileProcess()
    cp.start()
    pid = cp.pid
    assert pid is not None
    cp.close()
    assert cp.pid is None
    with pytest.raises(RuntimeError, match="compile process was closed"):
        cp.start()
    with pytest.raises(RuntimeError, match="compile process was closed"):
        cp.warm()
    assert cp.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.inductor
def test_compile_process_reports_errors_and_survives_its_own_death():
    cp = CompileProcess()
    try:
        g = fx.Graph()
        a, b = g.placeholder("a"), g.placeholder("b")
        g.output((g.call_function(torch.ops.aten.mm.default, (a, b)),))
        gm = fx.GraphModule(torch.nn.Module(), g)
        x, w = torch.randn(3, 4), torch.randn(4, 5)
        fn, seconds = cp.compile_graph(gm, [x, w], None)
        assert_close(fn(x, w)[0], x @ w)
        assert seconds > 0
        first = cp.pid

        # A graph that cannot compile: the worker gets the compile process's reason.
        with pytest.raises(RuntimeError, match="mm|size|shape"):
            cp.compile_graph(gm, [torch.randn(3, 4), torch.randn(5, 6)], None)
        assert cp.pid == first  # an error is not a death

        # The process dies while compiling: a clear error, and the next compile starts a new one.
        class Exit:
            def __reduce__(self):
                return (os._exit, (3,))

        with pytest.raises(CompileProcessDied, match="exit code 3.*started again"):
            cp._compile(("graph", pickle.dumps(Exit())), [], None)
        fn, _ = cp.compile_graph(gm, [x, w], None)
        assert_close(fn(x, w)[0], x @ w)
        assert cp.pid not in (None, first)

        # Killed between compiles: started again, no error.
        os.kill(cp.pid, signal.SIGKILL)
        cp._proc.wait(timeout=10)
        fn, _ = cp.compile_graph(gm, [x, w], None)
        assert_close(fn(x, w)[0], x @ w)
    finally:
        cp.close()
    assert cp.pid is None


@pytest.mark.parametrize("background, where", [(True, "thread"), (False, "inline")])
def test_where_a_compile_runs_is_in_its_event(inprocess, background, where):
    import test_perf_paths  # noqa: F401  (registers the counting backend)

    gt_core.configure(
        auto_compile=True, backend="gt_counting_lift", background=background, threshold=3
    )
    try:
        with gt_core.capture():
            _train(True)
    finally:
        gt_core.configure(auto_compile=False, backend="eager", background=True, threshold=5)
    assert [e["where"] for e in _events(ev.COMPILE_STARTED)] == [where]


def test_compile_process_option_from_env():
    assert from_env({}).compile_process is True
    assert from_env({"GT_COMPILE_PROCESS": "0"}).compile_process is False


def test_a_capture_without_inductor_stops_the_compile_process(inprocess):
    gt_core.configure(backend="inductor", auto_compile=True, background=True)
    try:
        with gt_core.capture():
            engine = gt_core.client.capture.session().transport.engine
            assert engine.compile_process() is not None
        with gt_core.capture(backend="eager"):
            assert engine.compiler._process is None  # a warm-up of a spawned worker is cut short too
    finally:
        gt_core.configure(auto_compile=False, backend="eager")
