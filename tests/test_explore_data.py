"""The explorer's data in the report: each entry of a hot path's canonical form with the
user's line, nn.Module and phase that recorded it; the block's lines with their ops and time
share; its FX and generated code; its compile phases. Small real loops, eager as the oracle.
"""

from __future__ import annotations

import pytest
import torch
from conftest import line_of

import gt_core
from gt_core.client.plans.sites import Siting
from gt_core.observe import events as ev
from gt_core.observe.explore import lines

STEPS = 12


def _train(steps: int = STEPS):
    """An MLP (nn.Sequential) trained with SGD; the lines of its phases, and the loss."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)  # FORWARD
        loss.backward()  # BACKWARD
        opt.step()  # OPTIMIZER
        opt.zero_grad()
    return loss


@pytest.fixture
def hot(inprocess):
    """The MLP loop run with hot-path compilation on (eager backend): its report's hot path."""
    gt_core.configure(auto_compile=True, threshold=3)
    with gt_core.capture():
        loss = _train()
        got = loss.item()
    gt_core.wait()
    torch.manual_seed(0)
    assert got == pytest.approx(_train().item(), rel=1e-6)  # eager: the oracle
    (path,) = gt_core.report().to_data()["hot_paths"]
    return path


def test_each_entry_carries_the_users_line_its_module_and_its_phase(hot):
    ops = [e for e in hot["canonical"]["entries"] if e["kind"] == "op"]
    assert len(ops) == hot["n_ops"]
    want = {line_of(_train, m): m for m in ("FORWARD", "BACKWARD", "OPTIMIZER")}
    assert {e["source"] for e in ops} == set(want)
    for e in ops:
        assert e["text"].endswith("# " + want[e["source"]])
    # the Sequential's children by their names; the loss outside any module
    forward = [e for e in ops if e["phase"] == "forward"]
    assert [e["module"] for e in forward if e["op"] == "aten.addmm.default"] == ["0", "2"]
    assert any(e["op"] == "aten.relu.default" and e["module"] == "1" for e in forward)
    assert any(e["op"] == "aten.mse_loss.default" and e["module"] is None for e in forward)
    # backward ops carry the module of the forward op they differentiate
    backward = [e for e in ops if e["phase"] == "backward"]
    assert {"0", "1", "2"} <= {e["module"] for e in backward}
    assert {e["source"] for e in backward} == {line_of(_train, "BACKWARD")}
    # optimizer ops: no nn.Module, their optimizer's class; no other op has one
    assert all(
        (e["module"] is None and e["optimizer"] == "SGD")
        if e["phase"] == "optimizer"
        else e["optimizer"] is None
        for e in ops
    )
    # the phases in the order the step runs them
    phases = [e["phase"] for e in ops]
    order = [p for k, p in enumerate(phases) if k == 0 or phases[k - 1] != p]
    assert order == ["forward", "backward", "optimizer"]
    frees = [e for e in hot["canonical"]["entries"] if e["kind"] == "free"]
    assert frees and all(e["source"] is None and e["phase"] is None for e in frees)


def test_the_blocks_lines_count_its_ops_and_split_its_time(hot):
    got = hot["lines"]
    assert [x["source"] for x in got] == [
        line_of(_train, m) for m in ("FORWARD", "BACKWARD", "OPTIMIZER")
    ]
    assert sum(x["ops"] for x in got) == hot["n_ops"]
    assert all(x["share"] > 0 for x in got)  # from the eager runs it was found in
    assert sum(x["share"] for x in got) == pytest.approx(1.0, abs=1e-3)


def test_the_code_and_the_compile_phases_come_with_the_compile(hot):
    assert "def forward" in hot["code"]["fx"] and "aten.addmm" in hot["code"]["fx"]
    assert hot["code"]["generated"] is None  # the eager backend generates none
    assert set(hot["compile_phases"]) == {"lowering"} and hot["cache"] is None


def test_sites_are_taken_in_one_occurrence_only(inprocess, monkeypatch):
    """Recording's steady state pays no frame walk: one occurrence's ops are sited, once.

    (A block found in a later capture than the session's first; the first capture sites what
    it records before plans come: tests/test_early_sites.py.)"""
    with gt_core.capture():
        torch.ones(2).add(1)
    calls = []
    here = Siting.here
    monkeypatch.setattr(Siting, "here", lambda self: calls.append(1) or here(self))
    gt_core.configure(auto_compile=True, threshold=3)
    with gt_core.capture():
        _train(steps=40).item()
    gt_core.wait()
    events = gt_core.events_log().snapshot()
    (sites,) = [e for e in events if e["type"] == ev.SITES]
    n_ops = sum(1 for x in sites["entries"] if x is not None)
    # one occurrence (and the start of one cut short by a mismatch, if any), never per step
    assert n_ops <= len(calls) < 2 * n_ops


def test_lines_without_a_profile_have_no_share():
    canon = {"entries": [{"kind": "op", "source": "f.py:3", "text": "y = f(x)"}]}
    assert lines(canon, None) == [{"source": "f.py:3", "text": "y = f(x)", "ops": 1, "share": None}]
    assert lines(None, None) == []


@pytest.mark.inductor
def test_inductor_gives_its_generated_code_and_phases(inprocess):
    gt_core.configure(auto_compile=True, threshold=3, backend="inductor", background=False)
    with gt_core.capture():
        _train(steps=6).item()
    gt_core.wait(compiles=True, timeout=300)
    (path,) = gt_core.report().to_data()["hot_paths"]
    assert path["status"] == "compiled"
    assert "def call(" in path["code"]["generated"]  # inductor's output code
    assert {"lowering", "aot", "inductor"} <= set(path["compile_phases"])
    assert path["cache"] in ("hit", "miss", "bypass")


def test_syncs_and_uploads_are_counted_on_the_users_lines(inprocess):
    x = torch.randn(5, 8)  # a host tensor: uploaded where the capture first uses it
    with gt_core.capture():
        w = torch.randn(8, 4)
        y = x @ w  # UPLOAD
        for _ in range(3):
            y.sum().item()  # SYNC
    d = gt_core.report().to_data()
    here = __file__ + ":"
    uploads = {k.removeprefix(here): n for k, n in d["lines"]["uploads"].items()}
    syncs = {k.removeprefix(here): n for k, n in d["lines"]["syncs"].items()}
    import inspect

    src, first = inspect.getsourcelines(test_syncs_and_uploads_are_counted_on_the_users_lines)
    line = {m: str(first + next(i for i, s in enumerate(src) if s.rstrip().endswith("# " + m)))
            for m in ("UPLOAD", "SYNC")}  # fmt: skip
    assert uploads == {line["UPLOAD"]: 1}
    assert syncs[line["SYNC"]] == 3


def test_the_diff_marks_an_inserted_op_alone_not_every_op_after_it(inprocess):
    """Two hot paths of one loop, the second with one more op in its forward (and so one
    more in its backward): the Diff marks those two ops of B and nothing of A."""
    from gt_jupyter._explore._data import differing

    def train(scale: bool):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(5, 8), torch.randn(5, 4)
        for _ in range(STEPS):
            h = model(x)
            if scale:
                h = h * 2.0
            loss = torch.nn.functional.mse_loss(h, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        return loss.item()

    gt_core.configure(auto_compile=True, threshold=3)
    with gt_core.capture():
        got = [train(False), train(True)]
    gt_core.wait()
    assert got == [pytest.approx(train(s), rel=1e-6) for s in (False, True)]  # eager
    a, b = (p["canonical"] for p in gt_core.report().to_data()["hot_paths"])
    ops_b = [e for e in b["entries"] if e["kind"] == "op"]
    words, marked_a, marked_b = differing(a, b)
    assert "aten.mul.Tensor" in words
    assert marked_a == set()
    assert [ops_b[int(k[2:])]["op"] for k in sorted(marked_b)] == ["aten.mul.Tensor"] * 2


def test_syncs_per_line_count_from_a_cells_start_and_from_a_reset(inprocess):
    """A cell's view counts its own syncs on each line; a reset counts from zero."""
    import inspect

    def cell(n: int) -> None:
        with gt_core.capture():
            y = torch.ones(3)
            for _ in range(n):
                y.sum().item()  # SYNC

    src, first = inspect.getsourcelines(cell)
    key = (
        f"{__file__}:{first + next(i for i, s in enumerate(src) if s.rstrip().endswith('# SYNC'))}"
    )
    cell(2)
    mark = gt_core.events_log().mark()
    cell(3)
    assert gt_core.report().to_data()["lines"]["syncs"][key] == 5
    assert gt_core.report(since=mark).to_data()["lines"]["syncs"][key] == 3
    gt_core.reset()
    cell(1)
    assert gt_core.report().to_data()["lines"]["syncs"][key] == 1
