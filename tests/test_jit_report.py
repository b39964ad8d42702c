"""gt_core.jit in the report and the dashboard: each call key's state, replays, and why not."""

import json

import torch

import gt_core
from gt_core.observe import events as ev
from gt_core.observe.jit_summary import JitState
from gt_core.observe.report import Report, summarize
from gt_jupyter import _render, _tables
from gt_jupyter.dashboard import Dashboard


def _jit_rows(data):
    return [r for r in _tables.reason_rows(data) if r["kind"].startswith("jit")]


def test_a_sync_inside_the_step_is_a_refusal_in_report_text_and_dashboard(inprocess):
    with gt_core.capture():
        w = torch.ones(4)

        @gt_core.jit
        def step(x):
            loss = (w * x).sum()
            loss.item()
            return loss

        for i in range(6):
            step(torch.full((4,), float(i)))
    report = gt_core.report()
    data = report.to_data()
    (j,) = data["jit"]
    assert j["function"].endswith(".step") and j["keys"] == 1  # (its qualname)
    assert j["state"] == JitState.REFUSED and j["replayed"] == 0
    assert "a sync inside the step" in j["reason"]
    assert j["explanation"]["id"] == "jit_sync"
    text = str(report)
    assert "jit: 1 refused" in text.splitlines()[0]
    assert f"jit {j['function']}: refused: a sync inside the step" in text
    assert "-> move the sync out of the jitted function" in text
    (row,) = _jit_rows(data)
    assert row["kind"] == "jit refused" and row["reason"] == j["reason"]
    assert "move the sync out of the jitted function" in row["what to do"]
    parts = Dashboard(data, mode="notebook").bundles()
    assert "jit: 1 refused" in parts["headline"]["text/plain"]
    assert "jit refused" in parts["tables"]["text/html"]
    json.dumps(data)


def test_a_refusal_with_no_hot_path_at_all_is_reported(inprocess):
    with gt_core.capture():
        w = torch.ones(3)
        scale = [1.0]

        @gt_core.jit
        def step():
            scale[0] *= 2
            return w * scale[0]

        for _ in range(3):
            step()
    data = gt_core.report().to_data()
    assert data["hot_paths"] == []  # nothing but the refusal says what happened
    (j,) = data["jit"]
    assert j["state"] == "refused" and j["signature"] is None
    assert "aten.mul.Tensor" in j["reason"] and "2.0 -> 4.0" in j["reason"]
    assert j["explanation"]["id"] == "jit_python_number"
    assert "(2.0 → 4.0)" in j["explanation"]["cause"]
    assert f"jit {j['function']}: refused: a Python number" in str(gt_core.report())
    (row,) = _jit_rows(data)
    assert row["where"] == j["function"] and "lr=torch.tensor" in row["what to do"]
    assert "jit: 1 refused" in _render.headline(data)


def test_a_replaying_function_shows_its_block_and_replays(inprocess):
    with gt_core.capture():
        w = torch.ones(3)

        @gt_core.jit
        def step(x):
            return (x * w).add(1.0, alpha=0.5)

        x = torch.ones(3)
        for _ in range(10):
            out = step(x)
        assert out.tolist() == [1.5] * 3
    report = gt_core.report()
    data = report.to_data()
    (j,) = data["jit"]
    assert j["state"] == JitState.REPLAYING and j["reason"] is None
    assert j["replayed"] == sum(e.replayed for e in step.entries.values()) > 0
    assert j["client_ms"] is not None
    assert {"op": "aten.add.Tensor", "arg": "alpha", "value": 0.5, "count": 1} in j["frozen"]
    (p,) = [p for p in data["hot_paths"] if p["signature"] == j["signature"]]
    assert p["jit"] == j["function"] and p["replayed_runs"] == j["replayed"]
    assert (
        f"jit {j['function']}: replaying block {j['signature']}, {j['replayed']} calls replayed ("
        in (str(report))
    )
    (row,) = _jit_rows(data)  # what a replay keeps frozen, not a refusal
    assert row["kind"] == "jit frozen" and row["where"] == f"{j['function']} ({j['signature']})"


def test_a_refused_step_s_block_is_named_and_not_advised_to_be_jitted(inprocess):
    """The refused step's block was detected (its marks' signal): the entry names it, and
    the hot path is known as jitted (no 'wrap it in @gt_core.jit' advice)."""
    gt_core.configure(auto_compile=True, background=False)
    with gt_core.capture():
        w = torch.ones(64, 64)

        @gt_core.jit
        def step(x):
            y = (x @ w).relu().sum()
            y.item()
            return y

        x = torch.ones(64, 64)
        for _ in range(8):
            step(x)
    data = gt_core.report().to_data()
    (j,) = data["jit"]
    assert j["state"] == "refused"
    sigs = [p["signature"] for p in data["hot_paths"]]
    assert j["signature"] in sigs
    assert data["hot_paths"][sigs.index(j["signature"])]["jit"] == j["function"]
    kinds = [r["kind"] for r in _tables.reason_rows(data)]
    assert "jit refused" in kinds and "jit would save" not in kinds


def test_an_input_that_no_longer_fits_says_the_call_ran(inprocess):
    with gt_core.capture():
        holder = {"w": torch.ones(3)}

        @gt_core.jit
        def f(x):
            return x * holder["w"]

        x = torch.ones(3)
        for _ in range(4):
            f(x)
        holder["w"] = torch.ones(3, dtype=torch.float64)
        f(x)
    data = gt_core.report().to_data()
    (j,) = data["jit"]
    assert j["state"] == JitState.RERECORDING and "no longer fits" in j["reason"]
    assert j["explanation"]["id"] == "jit_unfit"
    (row,) = _jit_rows(data)
    assert row["kind"] == "jit re-recording" and "in place" in row["what to do"]
    assert f"jit {j['function']}: re-recording (that call ran its Python):" in str(gt_core.report())


# -- the data, from events alone ---------------------------------------------------------
def _stats(name, replayed, sig=None, fn="step"):
    return ev.event(ev.JIT_STATS, function=fn, name=name, signature=sig, replayed=replayed)


def test_each_call_key_is_an_entry_counted_per_function_and_per_view():
    a, b = "jit:step:1:0", "jit:step:1:1"
    events = [
        ev.event(ev.JIT, function="step", name=a, state="replaying", signature="s1", frozen=[]),
        _stats(a, 5, "s1"),
        _stats(b, 0),  # a second key, recording
        _stats("jit:other:2:0", 0, fn="other"),
    ]
    since = len(events)
    events += [_stats(a, 12, "s1")]
    whole = {j["name"]: j for j in summarize(events)["jit"]}
    assert whole[a]["keys"] == whole[b]["keys"] == 2 and whole["jit:other:2:0"]["keys"] == 1
    assert whole[a]["state"] == "replaying" and whole[a]["replayed"] == 12
    assert whole[b]["state"] == "recording" and whole[b]["signature"] is None
    view = summarize(events, since)["jit"]
    assert [(j["name"], j["replayed"]) for j in view] == [(a, 7)]  # the view's replays
    assert not _jit_rows(summarize(events))  # nothing to change: no reason row
    lines = str(Report(events)).splitlines()
    assert "  jit step (key 1 of 2): replaying block s1, 12 calls replayed" in lines
    assert any(x.startswith("  jit step (key 2 of 2): recording") for x in lines)


def test_a_refused_key_that_ran_again_keeps_its_latest_state():
    name = "jit:step:1:0"
    events = [
        ev.event(ev.JIT, function="step", name=name, state="replaying", signature="s1", frozen=[1]),
        ev.event(
            ev.JIT,
            function="step",
            name=name,
            state="re-recording",
            trigger="unfit",
            signature="s1",
            reason="argument 0 no longer fits the block (metadata x): the function ran instead",
            cause={"kind": "unfit", "place": "argument 0", "what": "metadata x"},
        ),
    ]
    (j,) = summarize(events)["jit"]
    assert j["state"] == "re-recording" and j["frozen"] == []
    # The explanation is rendered from the typed cause, not parsed from the reason's words.
    assert j["explanation"]["cause"].startswith("argument 0 no longer fits the block (metadata x)")
    assert j["explanation"]["id"] == "jit_unfit"
    events.append(
        ev.event(ev.JIT, function="step", name=name, state="replaying", signature="s1", frozen=[])
    )
    (j,) = summarize(events)["jit"]
    assert j["state"] == "replaying" and j["reason"] is None and j["explanation"] is None
