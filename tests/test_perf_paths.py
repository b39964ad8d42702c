"""Lifted scalars (Adam's bias corrections, LR schedules), shadows of step counters."""

import contextlib
import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from models import mlp

import gt_core
from gt_core import events as ev

COMPILES: list = []


@torch._dynamo.register_backend
def gt_counting_lift(gm, example_inputs):
    COMPILES.append([n.name for n in gm.graph.nodes if n.op == "placeholder"])
    return gm.forward


@pytest.fixture
def hot(inprocess):
    COMPILES.clear()
    gt_core.configure(
        auto_compile=True,
        backend="gt_counting_lift",
        background=False,
        threshold=3,
        regression_samples=10_000,
    )
    yield
    gt_core.configure(
        auto_compile=False, background=True, threshold=5, backend="eager", regression_samples=5
    )


def _train(make_opt, make_sched, steps, on_worker, sync_every=0):
    """Train an MLP; the scheduler steps every iteration. Returns (model, losses)."""
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    losses = []
    with ctx:
        torch.manual_seed(0)
        model = mlp()
        opt = make_opt(model.parameters())
        sched = make_sched(opt) if make_sched else None
        x, y = torch.randn(16, 32), torch.randn(16, 4)
        for i in range(steps):
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if sched is not None:
                sched.step()
            if sync_every and i % sync_every == 0:
                losses.append(loss.item())
        losses.append(loss.item())
    return model, losses


def _events(kind):
    return [e for e in gt_core.report().to_data()["events"] if e["type"] == kind]


OPTIMIZERS = {
    "adam": functools.partial(torch.optim.Adam, lr=1e-2),
    "adam-foreach": functools.partial(torch.optim.Adam, lr=1e-2, foreach=True),
    "adamw": functools.partial(torch.optim.AdamW, lr=1e-2),
    "adamw-foreach": functools.partial(torch.optim.AdamW, lr=1e-2, foreach=True),
    "sgd-momentum": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9),
    "sgd-foreach": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, foreach=True),
}
SCHEDULERS = {
    "none": None,
    "cosine": functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=50),
    "lambda": functools.partial(
        torch.optim.lr_scheduler.LambdaLR, lr_lambda=lambda s: 1 / (1 + 0.1 * s)
    ),
}


@pytest.mark.parametrize("sched", list(SCHEDULERS), ids=list(SCHEDULERS))
@pytest.mark.parametrize("opt", list(OPTIMIZERS), ids=list(OPTIMIZERS))
def test_changing_scalars_compile_once_and_match_eager(hot, opt, sched):
    if opt.startswith("sgd") and sched == "none":
        pytest.skip("no scalar changes: covered by test_hotpath")
    steps = 16
    ref, ref_losses = _train(OPTIMIZERS[opt], SCHEDULERS[sched], steps, on_worker=False)
    got, got_losses = _train(OPTIMIZERS[opt], SCHEDULERS[sched], steps, on_worker=True)
    assert got_losses == pytest.approx(ref_losses, abs=1e-5)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b, atol=1e-5)
    paths = gt_core.report().to_data()["hot_paths"]
    compiled = [p for p in paths if p["status"] == "compiled"]
    assert len(compiled) == 1, paths
    (p,) = compiled
    # the whole step in one block: forward, backward and the optimizer's update
    assert "aten.mse_loss_backward.default" in p["ops"]
    assert any("addcdiv" in op or "add_" in op for op in p["ops"])
    assert p["compiled_runs"] >= steps - 8
    assert len(COMPILES) == 1, "one compile, no recompile"
    assert any(name.startswith("s") for name in COMPILES[0]), "the changing floats are inputs"
    assert not _events(ev.RECOMPILE) and not _events(ev.MISMATCH)


def test_adam_step_counter_item_needs_no_round_trip(inprocess):
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = torch.randn(4, 32)
        model(x).sum().backward()
        opt.step()
        session = gt_core.client.capture.session()
        before = session.counters["syncs"]
        for _ in range(3):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        assert session.counters["syncs"] == before
        step = opt.state[model[0].weight]["step"]
        assert step.item() == 4.0
        assert float(step.cpu()) == 4.0  # the worker's value agrees with the shadow


def test_shadow_refreshed_when_written_from_an_unshadowed_value(inprocess):
    with gt_core.capture():
        s = torch.tensor(2.0)
        v = s.view(())  # a view shares the shadow's storage
        s.add_(1)
        assert v.item() == 3.0
        big = torch.randn(8)
        s.copy_(big.sum())  # written from a worker value: the shadow is fetched again
        want = float(big.sum().cpu())
        assert s.item() == pytest.approx(want) and v.item() == pytest.approx(want)
        t = s * 2 + 1  # computed on shadows
        assert t.item() == pytest.approx(2 * want + 1)
        assert float(t.cpu()) == pytest.approx(2 * want + 1)


def test_lifted_graph_is_equal_with_inductor_style_alpha_rewrite(hot):
    gt_core.configure(backend="aot_eager")
    ref, _ = _train(OPTIMIZERS["adamw"], SCHEDULERS["cosine"], 14, on_worker=False)
    got, _ = _train(OPTIMIZERS["adamw"], SCHEDULERS["cosine"], 14, on_worker=True)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b, atol=1e-5)
    assert [p["status"] for p in gt_core.report().to_data()["hot_paths"]].count("compiled") == 1


@pytest.mark.inductor
def test_adam_with_scheduler_inductor_compiles_once_and_matches(inprocess):
    gt_core.configure(
        auto_compile=True,
        backend="inductor",
        background=False,
        threshold=3,
        regression_samples=10_000,
    )
    try:
        ref, _ = _train(OPTIMIZERS["adam"], SCHEDULERS["cosine"], 14, on_worker=False)
        got, _ = _train(OPTIMIZERS["adam"], SCHEDULERS["cosine"], 14, on_worker=True)
        for a, b in zip(got.parameters(), ref.parameters(), strict=True):
            assert_close(a, b, atol=1e-5)
        finished = _events(ev.COMPILE_FINISHED)
        assert len(finished) == 1 and not _events(ev.COMPILE_FAILED)
    finally:
        gt_core.configure(
            auto_compile=False, background=True, threshold=5, backend="eager", regression_samples=5
        )


@pytest.mark.inductor
def test_reduce_overhead_mode_reaches_the_compiled_block(inprocess, monkeypatch):
    """mode="reduce-overhead" (CUDA graphs where a GPU is) is passed to inductor as given."""
    seen = []
    real = torch._TorchCompileInductorWrapper

    def spy(mode, options, dynamic):
        seen.append(mode)
        return real(mode, options, dynamic)

    monkeypatch.setattr(torch, "_TorchCompileInductorWrapper", spy)
    gt_core.configure(
        auto_compile=True,
        backend="inductor",
        mode="reduce-overhead",
        background=False,
        threshold=3,
        regression_samples=10_000,
    )
    try:
        ref, _ = _train(OPTIMIZERS["adam"], None, 10, on_worker=False)
        got, _ = _train(OPTIMIZERS["adam"], None, 10, on_worker=True)
        for a, b in zip(got.parameters(), ref.parameters(), strict=True):
            assert_close(a, b, atol=1e-5)
    finally:
        gt_core.configure(auto_compile=False, backend="eager", mode=None, regression_samples=5)
    assert seen == ["reduce-overhead"]
    assert len(_events(ev.COMPILE_FINISHED)) == 1 and not _events(ev.COMPILE_FAILED)


def test_int_lists_and_scalar_keywords_take_the_fast_path(inprocess, monkeypatch):
    from gt_core.client.recording import record as _recording

    slow = []
    real = _recording._record

    def counting(cls, func, args, kwargs):
        slow.append(str(func))
        return real(cls, func, args, kwargs)

    def f(a, b):
        c = a.view(3, 8).add_(b.view(3, 8), alpha=0.5)
        return c.sum(dim=[0], keepdim=True)

    a, b = torch.randn(24), torch.randn(24)
    want = f(a.clone(), b)
    monkeypatch.setattr(_recording, "_record", counting)
    with gt_core.capture():
        pa, pb = torch.randn(24), torch.randn(24)
        pa.copy_(a), pb.copy_(b)
        f(pa.clone(), pb)  # the first time fills the metadata cache (slow path)
        slow.clear()
        got = f(pa.clone(), pb)
        assert slow == [], (
            "view([ints]), add_(alpha=) and sum(dim=[ints], keepdim=) recorded inline"
        )
        assert_close(got, want)


def test_changing_floats_reuse_cached_metadata_where_values_cannot_matter(inprocess):
    from gt_core.client.recording import meta

    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=50)
        x = torch.randn(4, 32)
        sizes = []
        for _ in range(8):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            sizes.append(len(meta.meta_cache))
        assert sizes[-1] == sizes[2], "new bias corrections every step, no new cache entries"
        # where a float's value decides the shape, it stays in the key
        assert torch.arange(0, 5.5, 0.5).shape == (11,)
        assert torch.arange(0, 5.0, 0.5).shape == (10,)
        assert torch.nn.functional.interpolate(torch.randn(1, 1, 4), scale_factor=2.0).shape == (
            1,
            1,
            8,
        )
        assert torch.nn.functional.interpolate(torch.randn(1, 1, 4), scale_factor=3.0).shape == (
            1,
            1,
            12,
        )


def test_the_inline_cache_key_equals_the_one_the_slow_path_builds(inprocess, monkeypatch):
    """record builds an op's metadata-cache key inline, by hand; on an op's first sight the
    inline lookup misses and _record looks its own key up at once: both keys are logged, and
    must be the same key (else the two paths would fill the cache twice, or disagree)."""
    from gt_core.client.recording import record as _recording

    log = []

    class Keys(dict):
        def get(self, key, default=None):
            log.append(("get", key))
            return super().get(key, default)

    real_slow = _recording._record
    monkeypatch.setattr(_recording, "meta_cache", Keys())
    monkeypatch.setattr(
        _recording,
        "_record",
        lambda c, f, a, k: (log.append(("slow", f)), real_slow(c, f, a, k))[1],
    )
    with gt_core.capture():
        torch.manual_seed(0)
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        x = torch.randn(4, 32)
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        a = torch.randn(24)
        a.view(3, 8).add_(a.view(3, 8), alpha=0.5).sum(dim=[0], keepdim=True).mul(2.5)
    # an inline lookup (not the slow path's own: that follows its "slow" mark) that missed,
    # then the slow path for the same op, and its lookup
    pairs = [
        (log[i][1], log[i + 2][1])
        for i in range(1, len(log) - 2)
        if log[i][0] == "get"
        and log[i - 1][0] != "slow"
        and log[i + 1] == ("slow", log[i][1][0])
        and log[i + 2][0] == "get"
    ]
    assert len(pairs) >= 20, f"only {len(pairs)} ops took both paths: the check checks little"
    with_kwargs = [k for k, _ in pairs if type(k[-1]) is tuple and type(k[-1][0]) is str]
    assert with_kwargs, "no op with keyword arguments compared"
    differ = [(fast, slow) for fast, slow in pairs if fast != slow]
    assert not differ, differ[:3]
