"""A worker group: 2 local ranks (gloo, one thread each) run one stream; eager is the oracle."""

import contextlib
import os
import signal

import psutil
import pytest
import torch
from conftest import until
from IPython.core.error import UsageError

import gt_core
from gt_bench.workloads import TRANSFORMER, mlp, training_step
from gt_core.client import capture as _capture
from gt_core.options import from_env, load_signals
from gt_jupyter._render import to_html

STEPS = 50


def _mlp_data():
    return torch.randn(32, 32), torch.randn(32, 4)


def _run(make_model, make_data, loss_fn, on_worker, jit=False, lr=0.05):
    """Train STEPS steps; (parameters, last loss, the jitted function or None)."""
    ctx = gt_core.capture(workers=2) if on_worker else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        x, y = make_data()
        step = training_step(model, opt, loss_fn)
        fn = gt_core.jit(step) if jit else step
        for _ in range(STEPS):
            loss = fn(x, y)
        last = loss.item()
    return [p.detach().cpu() for p in model.parameters()], last, fn if jit else None


WORKLOADS = {
    "mlp": (mlp, _mlp_data, torch.nn.functional.mse_loss),
    "transformer": (TRANSFORMER["make_model"], TRANSFORMER["make_data"], TRANSFORMER["loss_fn"]),
}


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_two_ranks_equal_eager_plain_and_jit_and_compile_on_every_rank(group, workload):
    spec = WORKLOADS[workload]
    want, want_loss, _ = _run(*spec, on_worker=False)
    for jit in (False, True):
        gt_core.reset()
        got, got_loss, fn = _run(*spec, on_worker=True, jit=jit)
        assert got_loss == pytest.approx(want_loss, abs=1e-5)
        for g, e in zip(got, want, strict=True):
            torch.testing.assert_close(g, e, atol=1e-5, rtol=0)
        if jit:
            assert sum(e.replayed for e in fn.entries.values()) > 0
        t = _capture.session().transport
        assert len(t.procs) == 2 and all(p.is_alive() for p in t.procs)
        gt_core.wait()
        data = gt_core.report().to_data()
        compiled = {p["signature"] for p in data["hot_paths"] if p["status"] == "compiled"}
        assert compiled, data["hot_paths"]
        ranks = data["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        for r in ranks:  # every rank compiled the same hot path and ran it compiled
            assert compiled & set(r["compiled"]), (r, compiled)
            assert r["compiled_runs"] > 0 and r["step_ms"] > 0
            assert r["collectives"] >= 2  # the compile and its check, agreed
        assert "worker group: 2 ranks" in str(gt_core.report())
        assert "<b>worker group</b>" in to_html(data, figures=False)  # the dashboard's table


def test_a_killed_rank_is_one_line_and_the_group_goes(group):
    with gt_core.capture(workers=2):
        a = torch.ones(3) + 1
        assert a.sum().item() == 6.0
    t = _capture.session().transport
    group.append(t)
    os.kill(t.procs[1].pid, signal.SIGKILL)
    assert until(lambda: not gt_core.worker().alive, 10)
    with pytest.raises(gt_core.WorkerDied, match=r"^gt worker group .*rank 1 .*SIGKILL") as info:
        a.sum().item()
    assert "\n" not in str(info.value)
    assert until(lambda: not any(p.is_alive() for p in t.procs), 10)  # rank 0 went too
    with gt_core.capture(workers=2):  # a fresh capture starts a fresh group
        assert (torch.ones(2) * 3).sum().item() == 6.0
    assert _capture.session().transport is not t
    with pytest.raises(gt_core.WorkerLost):
        a.sum()


def test_the_group_options_and_what_is_refused(tmp_path):
    assert from_env({"GT_WORKERS": "2"}).workers == 2
    with pytest.raises(gt_core.ConfigError, match=r"^GT_WORKERS=0 .* from 1 to 64"):
        from_env({"GT_WORKERS": "0"})
    with pytest.raises(gt_core.ConfigError, match=r"worker='inprocess'.*local processes"):
        gt_core.Options(worker="inprocess").replace(workers=2)
    spec = tmp_path / "signals.yaml"
    spec.write_text("batch: {compile: true, shard: {axis: 0, workers: [0, 1]}}\n")
    signals = load_signals(spec)
    assert signals == {"batch": {"compile": True, "shard": {"axis": 0, "workers": [0, 1]}}}
    assert from_env({"GT_CONFIG": str(spec), "GT_WORKERS": "2"}).signals == signals
    with pytest.raises(gt_core.ConfigError, match=r"no shard with one worker.*workers=2"):
        from_env({"GT_CONFIG": str(spec)})  # sharding needs a group
    assert from_env({"GT_SHARD": "batch=0", "GT_WORKERS": "2"}).shard == {"batch": 0}
    with pytest.raises(gt_core.ConfigError, match=r"^GT_SHARD='batch' .*signal name -> axis"):
        from_env({"GT_SHARD": "batch", "GT_WORKERS": "2"})
    spec.write_text("batch: {shard: {axis: 0, workers: [0, 2]}}\n")
    with pytest.raises(gt_core.ConfigError, match=r"shard workers=\[0, 2\] .*every rank"):
        with gt_core.capture(workers=2, config=str(spec)):  # (refused before a rank starts)
            pass
    for bad in ("{axis: -1}", "{axis: 0, workers: []}", "{axis: 0, rows: 2}", "2"):
        spec.write_text(f"batch: {{shard: {bad}}}\n")
        with pytest.raises(gt_core.ConfigError, match=r"expected shard: \{axis: A"):
            load_signals(spec)


def test_gt_cell_workers_and_shard_flags(group):
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or InteractiveShell.instance()
    ip.run_line_magic("load_ext", "gt_jupyter")
    try:
        with pytest.raises(UsageError, match=r"--shard 'x': expected NAME=AXIS"):
            ip.run_cell_magic("gt", "--workers 2 --shard x", "pass")
        with pytest.raises(UsageError, match=r"no shard with one worker"):
            ip.run_cell_magic("gt", "--shard batch=0", "pass")
        r = ip.run_cell(
            "%%gt --workers 2 --shard batch=0 --no-compile\nimport torch, gt_core\n"
            "with gt_core.signal.context('batch'):\n    b = torch.arange(8.0).view(4, 2)\n"
            "s = (b * 2).sum(0).tolist()\nw = b.cpu()\n"
        )
        assert r.success, r.error_in_exec
        assert ip.user_ns["s"] == [24.0, 32.0]  # (a sum over the sharded axis: both halves)
        assert torch.equal(ip.user_ns["w"], torch.arange(8.0).view(4, 2))
        r = ip.run_cell(
            "%%gt --workers 2 --no-compile\nimport torch\nz = (torch.ones(4) * 2).sum().item()\n"
        )
        assert r.success, r.error_in_exec
        assert ip.user_ns["z"] == 8.0
        assert len(_capture.session().transport.procs) == 2
        pids = [p.pid for p in _capture.session().transport.procs]
        assert all(psutil.pid_exists(p) for p in pids)
    finally:
        ip.run_line_magic("unload_ext", "gt_jupyter")
        ip.config.pop("GT", None)
