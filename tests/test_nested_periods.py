"""Periods nested in a longer one: a run of alike ops inside a training step (the backward
through a chain of alike parameters, the optimizer's updates of them) repeats back to back
and is found before the step has repeated. The step is found all the same, compiled, equal
to eager, and the shorter block is retired (a status of its own in the report and the
dashboard)."""

import functools

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, moved
from models import train
from torch import nn

import gt_core
from gt_core import events as ev
from gt_core.observe.report import Report
from gt_core.observe.status import Status

COMPILED: list = []


@torch._dynamo.register_backend
def gt_counting_nested(gm, example_inputs):
    COMPILED.append(len(gm.graph.nodes))
    return gm.forward


SGD = functools.partial(torch.optim.SGD, lr=0.01, momentum=0.9)
STEPS = 12


class Chain(nn.Module):
    """A Linear, then ``n`` parameters of one shape applied in a chain, then a Linear."""

    def __init__(self, n: int, how: str):
        super().__init__()
        self.inp = nn.Linear(16, 32)
        shape = (32, 32) if how == "matmul" else (32,)
        self.ws = nn.ParameterList(
            [
                nn.Parameter(torch.randn(shape) * 0.2 + (0 if how == "matmul" else 1))
                for _ in range(n)
            ]
        )
        self.out = nn.Linear(32, 4)
        self.how = how

    def forward(self, x):
        x = self.inp(x)
        for w in self.ws:
            x = x @ w if self.how == "matmul" else x * w
        return self.out(x)


@pytest.fixture
def nested(inprocess):  # (threshold 3, min_seq 8: the inprocess fixture's)
    COMPILED.clear()
    gt_core.configure(
        auto_compile=True, backend="gt_counting_nested", background=False, threshold=3
    )


def _data():
    return torch.randn(8, 16), torch.randn(8, 4)


def _trained_alike(make_model, steps=STEPS, **options):
    kw = dict(make_model=make_model, make_opt=SGD, make_data=_data, loss_fn=F.mse_loss)
    ref, ref_losses = train(on_worker=False, steps=steps, **kw)
    got, got_losses = train(on_worker=True, steps=steps, **kw, **options)
    assert got_losses == pytest.approx(ref_losses, abs=1e-5)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b, atol=1e-5)
    return gt_core.report().to_data()["hot_paths"]


def _the_step(paths: list, backward: set, threshold: int = 3) -> dict:
    """The whole step (forward, backward and update), compiled. Every other hot path is
    retired, run by it, or a loop of the setup or of the first step (the model's
    initialisation, the momentum buffers made) found and never seen again."""
    (step,) = [p for p in paths if p["status"] != Status.RETIRED and p["occurrences"] > threshold]
    assert step["status"] == Status.COMPILED and step["compiled_runs"] >= 3, step
    ops = set(step["ops"])
    assert {"aten.addmm.default", "aten.mse_loss_backward.default"} | backward <= ops
    assert {"aten.mul_.Tensor", "aten.add_.Tensor"} <= ops  # the optimizer's update
    for p in paths:
        if p is step:
            continue
        if p["status"] == Status.RETIRED:
            assert p["retired"]["by"] == step["signature"], p
            assert "larger loop's body" in p["retired"]["reason"]
        else:  # (its first occurrences alone: those it was found in)
            assert p["occurrences"] <= threshold and not p["compiled_runs"], p
    return step


@pytest.mark.parametrize("how", ["mul", "matmul"])
@pytest.mark.parametrize("n", range(1, 9))
def test_a_chain_of_alike_parameters_finds_the_whole_step(nested, n, how):
    """The backward's n alike steps (n >= 4) are found first, after a few instructions of the
    first steps; their occurrences join the history, so the step around them is found as
    soon as it has repeated, and they are retired."""
    step = _the_step(
        _trained_alike(lambda: Chain(n, how)),
        {"aten.mm.default"} if how == "matmul" else {"aten.sum.dim_IntList"},
    )
    forward = "aten.mm.default" if how == "matmul" else "aten.mul.Tensor"
    assert step["ops"].count(forward) >= n
    nested = [p for p in gt_core.report().to_data()["hot_paths"] if p["status"] == Status.RETIRED]
    assert nested or n < 3  # (found first from three alike parameters on, at threshold 3)
    assert step["occurrences"] >= STEPS - 3  # found by the fourth step, at threshold 3
    assert not step["recompile_reasons"]


def _gelu_norm_net():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))


@pytest.mark.parametrize("threshold", range(2, 6))
def test_a_gelu_layernorm_loop_of_60_steps_is_found_whole_at_every_threshold(nested, threshold):
    gt_core.configure(threshold=threshold)
    paths = _trained_alike(_gelu_norm_net, steps=60)
    backward = {"aten.native_layer_norm_backward.default", "aten.gelu_backward.default"}
    step = _the_step(paths, backward, threshold)
    # every step but the first (it makes the momentum buffers), the threshold's, the one in
    # flight at detection and the two eager runs before the compile
    assert step["compiled_runs"] >= 60 - threshold - 5


def test_a_retired_block_says_so_in_the_report_and_the_dashboard(nested):
    from gt_jupyter import _render, _tables
    from gt_jupyter.views import status_view

    paths = _trained_alike(lambda: Chain(6, "mul"))
    (inner,) = [p for p in paths if p["status"] == Status.RETIRED]
    step = _the_step(paths, set())
    events = gt_core.events_log().snapshot()
    (retired,) = [e for e in events if e["type"] == ev.RETIRED]
    assert retired["signature"] == inner["signature"] and retired["by"] == step["signature"]
    assert [s for s, _ in inner["states"]][-1] == Status.RETIRED

    report = gt_core.report()
    text = str(report)
    assert f"{inner['signature']} [retired]" in text
    assert f"    retired: {retired['reason']}" in text
    assert step["signature"] in retired["reason"]

    data = report.to_data()
    assert "1 retired" in _render.headline(data)
    assert _tables.summary(data)["retired"] == 1
    (row,) = [r for r in _tables.reason_rows(data) if r["kind"] == "retired"]
    assert row["where"] == inner["signature"] and row["reason"] == retired["reason"]
    assert row["what to do"].startswith("nothing to do")
    assert not [
        r
        for r in _tables.reason_rows(data)
        if r["where"] == inner["signature"] and r["kind"] == "jit would save"
    ]
    assert "gt-chip gt-retired'>retired<" in _render.tables_html(data)
    assert "fallbacks 0, retired 1; " in repr(status_view(data, gt_core.worker()))  # %gt status


def test_retired_is_final_whatever_events_of_the_block_come_after():
    """A compile of the block still running when it was retired may finish, or fail, later:
    its status stays retired (the report is plain data: no worker here)."""
    sig = "abc"
    events = [
        {"type": ev.DETECTED, "signature": sig, "ops": ["aten.mul.Tensor"], "n_ops": 1, "t": 1.0},
        moved(sig, "compiling", 2.0),
        {"type": ev.COMPILE_STARTED, "signature": sig, "t": 2.0},
        {"type": ev.RETIRED, "signature": sig, "reason": "inside xyz", "by": "xyz", "t": 3.0},
        moved(sig, "compiled", 4.0, was="compiling"),
        {"type": ev.COMPILE_FINISHED, "signature": sig, "seconds": 0.5, "t": 4.0},
        moved(sig, "reverted", 5.0, was="compiled"),
        {"type": ev.REVERT, "signature": sig, "reason": "slower", "t": 5.0},
    ]
    (p,) = Report(events).to_data()["hot_paths"]
    assert p["status"] == Status.RETIRED
    assert p["retired"] == {"reason": "inside xyz", "by": "xyz"}
    assert [s for s, _ in p["states"]] == [Status.HOT, Status.COMPILING, Status.RETIRED]


def test_a_block_retired_by_a_longer_loop_runs_again_once_its_own_loop_does(nested):
    """A loop, then a loop whose step holds the first one's (an op before it), then the first
    loop again, as cells run in turn: the second loop's block retires the first loop's, and
    the first loop, back, finds its block again (revived, compiled, with an event saying
    why). It was refused for good: that loop then had no block at all, every step op by op."""

    def three_loops(on_worker: bool):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        opt = SGD(model.parameters())
        x, y = _data()

        def step(inp):
            F.mse_loss(model(inp), y).backward()
            opt.step()
            opt.zero_grad()

        for make in (lambda: x, lambda: x * 2.0, lambda: x):
            for _ in range(STEPS):
                step(make())
            if on_worker:
                gt_core.wait()
                runs[len(runs)] = _compiled_runs()
        return [p.detach().cpu() if on_worker else p.detach().clone() for p in model.parameters()]

    def _compiled_runs():
        return {p["signature"]: p["compiled_runs"] for p in gt_core.report().to_data()["hot_paths"]}

    runs: dict[int, dict] = {}
    want = three_loops(False)
    with gt_core.capture():
        got = three_loops(True)
    for g, w in zip(got, want, strict=True):
        assert_close(g, w, atol=1e-5)
    events = gt_core.report().to_data()["events"]
    (retired,) = [e for e in events if e["type"] == ev.RETIRED]
    (revived,) = [e for e in events if e["type"] == ev.REVIVED]
    first = retired["signature"]
    assert revived["signature"] == first and retired["by"] in revived["reason"]
    assert revived["status"] == Status.COMPILED.value
    (p,) = [p for p in gt_core.report().to_data()["hot_paths"] if p["signature"] == first]
    assert p["status"] == Status.COMPILED and p["retired"] is None
    assert runs[2][first] - runs[1][first] >= STEPS - 5  # (the loop back runs it compiled)


def test_joined_occurrences_read_back_as_their_instructions_however_the_window_cuts_them():
    """An occurrence joins the history as its block's keys; its instructions are read only
    when asked for (a RUN carries none), or when the window drops part of it."""
    from gt_core.hotpath.blocks import Occurrence
    from gt_core.hotpath.history import History, local_key
    from gt_core.stream.instructions import FREE, OP, Free, Op, Ref

    def occurrence(base):  # mul(in, 2.0) -> t; add(t, in) -> u; free t
        return [
            Op(OP, 0, (Ref(base), 2.0), {}, (base + 1,)),
            Op(OP, 1, (Ref(base + 1), Ref(base)), {}, (base + 2,)),
            Free(FREE, base + 1),
        ]

    class Block:
        sig, nones, freed_inputs = "b", (None,) * 3, ()
        keys = tuple(local_key(i) for i in occurrence(0))
        hashes = tuple(map(hash, keys))
        entry_paths = ([()], [()], None)

    expanded = []

    def joined(base):
        def expand():
            expanded.append(base)
            return occurrence(base)

        return Occurrence([base], [], [base + 2], [base + 1], expand_=expand)

    cut = 0
    for window in (5, 6, 7, 8):
        H = History(lambda vid: None)
        expanded.clear()
        for k in range(1, 12):
            H.append(Op(OP, 2, (Ref(0),), {}, (1000 + k,)), torch.zeros(1), window)
            H.join(Block, joined(10 * k), window)
            assert len(H) <= 2 * window
        cut += len(expanded)  # (occurrences the window cut in two: read before it dropped them)
        before = len(expanded)
        H.read_from(len(H) - 2)  # (what detection does: it reads the last few periods)
        assert expanded[before:] == [110]  # the last occurrence alone
        assert H.keys == [local_key(i) for i in H.instrs] and None not in H.instrs
        assert H.paths == [[()] if i.code == OP else None for i in H.instrs]
        assert H.runs_within([0], len(H)) == {"b"}
    assert cut
