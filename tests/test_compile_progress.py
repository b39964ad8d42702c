"""A compile of the user's while it runs: the phase, the time so far and the cache, as
``user.compiling`` events; the backward's compile counted as a compile of its own.

The phases are fed to :class:`Progress` as Dynamo names them, on an injected clock (no
sleeps); one test watches a real compile.
"""

import pytest
import torch
from conftest import ManualClock

import gt_core
from gt_core.diagnostics.progress import Progress, phase_words
from gt_core.observe import events as ev
from gt_core.observe.user_compiles import compiling_text, summarize_user_compiles
from gt_jupyter._render import headline

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _progress():
    events, clock = [], ManualClock()
    p = Progress(lambda t, **f: events.append({"type": t, **f}), every_s=1.0, clock=clock)
    return p, events, clock


def test_a_compile_is_published_as_it_starts_every_second_and_as_it_ends():
    p, events, clock = _progress()
    p.started("dynamo")
    p.started("entire_frame_compile")
    p.started("bytecode_tracing")
    clock.t += 0.5
    p.tick()  # (not a second yet: nothing)
    clock.t += 1.0
    p.tick()
    p.ended("bytecode_tracing")
    for name in ("backend_compile", "compile_fx_inner", "fx_codegen_and_compile"):
        p.started(name)
    p.started("GraphLowering.run")
    clock.t += 2.0
    p.tick()
    p.ended("dynamo")  # (the phases left open inside it end with it)
    got = [(e["phase"], e["seconds"], e["cache"], e["done"]) for e in events]
    assert got == [
        ("Dynamo", 0.0, None, False),
        ("Dynamo: tracing the Python", 1.5, None, False),
        ("inductor: lowering", 3.5, "miss", False),
        ("done", 3.5, "miss", True),
    ]
    assert all(e["type"] == ev.USER_COMPILING for e in events)
    assert p.open == {}


def test_inductor_without_its_codegen_was_served_by_its_cache():
    p, events, clock = _progress()
    for name in ("dynamo", "backend_compile", "compile_fx_inner"):
        p.started(name)
    clock.t += 0.2
    for name in ("compile_fx_inner", "backend_compile", "dynamo"):
        p.ended(name)
    assert events[-1]["done"] and events[-1]["cache"] == "hit"


def test_phase_words_name_the_innermost_known_phase():
    assert phase_words(["dynamo", "backend_compile", "some_new_phase"]) == "the backend"
    assert (
        phase_words(
            [
                "dynamo",
                "backend_compile",
                "compile_fx_inner",
                "fx_codegen_and_compile",
                "PyCodeCache.load_by_key_path",
            ]
        )
        == "inductor: building the kernels (C++/Triton)"
    )
    assert phase_words([]) == "compiling"


def test_the_headline_says_which_function_compiles_which_phase_and_how_long():
    log = [
        {
            "type": ev.USER_COMPILING,
            "function": "step",
            "phase": "inductor: lowering",
            "seconds": 7.4,
            "cache": "miss",
            "backward": False,
            "done": False,
        },
    ]
    u = summarize_user_compiles(log)
    text = compiling_text(u[0])
    assert text == "compiling step: inductor: lowering · 7 s so far, inductor's cache missed"
    assert headline({"user_compiles": u}).startswith("gt: " + text)
    log.append({**log[0], "done": True, "phase": "done"})
    assert summarize_user_compiles(log)[0]["compiling"] is None


def test_a_real_compile_and_its_backward_are_two_compiles_not_a_recompile():
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    f = torch.compile(m, backend="aot_eager")
    with gt_core.diagnostics(eager_every=0):
        for _ in range(3):
            f(torch.randn(2, 4)).sum().backward()
    u = gt_core.report().to_data()["user_compiles"]
    assert [x["function"] for x in u] == ["Sequential"]
    assert u[0]["compiles"] == 1 and u[0]["recompile_reasons"] == []
    assert u[0]["backward_compiles"] == 1 and u[0]["compiling"] is None
    seen = [e for e in gt_core.events_log().snapshot() if e["type"] == ev.USER_COMPILING]
    assert [e["backward"] for e in seen if e["done"]] == [False, True]
    assert "1 backward compile(s)" in str(gt_core.report())
