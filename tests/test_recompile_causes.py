"""Every cause of a recompile: each failing guard of the cache entries a call missed, with
before -> after, tied to the user's call. Each named change is checked against torch: on its
own it makes torch recompile; an input that did not change is never named."""

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import gt_core
from gt_core import events as ev
from gt_core.diagnostics import torch_hooks
from gt_core.observe.guard_causes import cause_text

HERE = __file__


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def line_of(text: str) -> int:
    with open(HERE) as f:
        return next(i for i, ln in enumerate(f, 1) if text in ln and "line_of" not in ln)


def recompiles(fn):
    """The USER_RECOMPILE events of the calls ``fn`` makes under diagnostics."""
    with gt_core.diagnostics():
        fn()
    return [e for e in gt_core.events_log().snapshot() if e["type"] == ev.USER_RECOMPILE]


def texts(event, entry=None) -> set[str]:
    return {cause_text(c) for c in event["causes"] if entry in (None, c["entry"])}


def torch_recompiles(fn, first: tuple, second: tuple) -> bool:
    """Whether torch itself compiles again for ``second`` after ``first`` (a fresh cache)."""
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(fn, backend=counter)
    compiled(*first)
    compiled(*second)
    torch._dynamo.reset()
    return counter.frame_count == 2


def add(x, y):
    return x + y  # reads x and y


def scale(x, n):
    return x * n


def add3(x, y, z):
    return x + y + z


def test_a_shape_and_a_dtype_change_together_are_both_named():
    f = torch.compile(add, backend="eager")
    x8, x16d, y = torch.randn(8), torch.randn(16, dtype=torch.float64), torch.randn(1)

    def calls():
        f(x8, y)
        f(x16d, y)

    (r,) = recompiles(calls)
    assert "size" not in r["reason"]  # torch's own reason names one of the two
    assert texts(r) == {"x: size[0] 8 -> 16", "x: dtype float32 -> float64"}
    assert not [c for c in r["causes"] if c["input"] == "y"]
    # each named change on its own makes torch recompile; y's unchanged value does not
    assert torch_recompiles(add, (x8, y), (torch.randn(16), y))
    assert torch_recompiles(add, (x8, y), (torch.randn(8, dtype=torch.float64), y))
    assert not torch_recompiles(add, (x8, y), (torch.randn(8), torch.randn(1)))


def test_each_cause_every_entry_rejects_is_explained():
    f = torch.compile(add, backend="eager")
    y = torch.randn(1)
    with gt_core.diagnostics():
        f(torch.randn(8), y)
        f(torch.randn(16, dtype=torch.float64), y)
    ids = [x["id"] for x in gt_core.report().to_data()["user_compiles"][0]["explanations"]]
    assert sorted(ids) == ["dtype_change", "shape_change"]


def test_a_change_only_an_older_entry_rejects_is_listed_but_not_explained():
    f = torch.compile(add, backend="eager")
    y = torch.randn(1)
    with gt_core.diagnostics():
        f(torch.randn(8), y)
        f(torch.randn(16), y)  # entry 0/1: x's size dynamic
        f(torch.randn(32, dtype=torch.float64), y)
    (u,) = gt_core.report().to_data()["user_compiles"]
    last = u["recompiles"][-1]
    assert {cause_text(c) for c in last["causes"] if c["entry"] == "0/1"} == {
        "x: dtype float32 -> float64"
    }
    assert "x: size[0] 8 -> 32" in {cause_text(c) for c in last["causes"] if c["entry"] == "0/0"}
    shape = [x for x in u["explanations"] if x["id"] == "shape_change"]
    assert [x["count"] for x in shape] == [1]  # the first recompile's, not the last one's
    assert [x["id"] for x in u["explanations"] if x["id"] == "dtype_change"] == ["dtype_change"]


def test_an_int_and_a_shape_change_together_are_both_named():
    f = torch.compile(scale, backend="eager")

    def calls():
        f(torch.randn(8), 3)
        f(torch.randn(16), 4)

    (r,) = recompiles(calls)
    assert texts(r) == {"n: 3 -> 4", "x: size[0] 8 -> 16"}
    assert torch_recompiles(scale, (torch.randn(8), 3), (torch.randn(8), 4))
    assert torch_recompiles(scale, (torch.randn(8), 3), (torch.randn(16), 3))


def test_two_tensors_changing_are_both_named_and_the_unchanged_one_is_not():
    f = torch.compile(add3, backend="eager")
    z = torch.randn(4, 1)

    def calls():
        f(torch.randn(4, 3), torch.randn(4, 3), z)
        f(torch.randn(4, 5), torch.randn(4, 5), z)

    (r,) = recompiles(calls)
    assert texts(r) == {"x: size[1] 3 -> 5", "y: size[1] 3 -> 5"}
    assert {c["input"] for c in r["causes"]} == {"x", "y"}
    first = (torch.randn(4, 3), torch.randn(4, 3), z)
    assert torch_recompiles(add3, first, (torch.randn(4, 3), torch.randn(4, 1), z))
    assert not torch_recompiles(add3, first, (torch.randn(4, 3), torch.randn(4, 3), z.clone()))


def test_a_grad_mode_change_is_named_with_the_tensor_that_also_changed():
    f = torch.compile(add, backend="eager")
    y = torch.randn(1)

    def calls():
        f(torch.randn(8), y)
        with torch.no_grad():
            f(torch.randn(8, dtype=torch.float64), y)

    (r,) = recompiles(calls)
    assert texts(r) == {"grad_mode: True -> False", "x: dtype float32 -> float64"}


def test_a_grad_mode_change_alone_names_only_the_grad_mode():
    f = torch.compile(add, backend="eager")

    def calls():
        f(torch.randn(8), torch.randn(8))
        with torch.no_grad():
            f(torch.randn(8), torch.randn(8))

    (r,) = recompiles(calls)
    assert texts(r) == {"grad_mode: True -> False"}


def test_a_cause_names_the_callers_line_and_where_the_value_was_read():
    f = torch.compile(add, backend="eager")

    def calls():
        f(torch.randn(8), torch.randn(8))
        f(torch.randn(16), torch.randn(16))  # the second call

    (r,) = recompiles(calls)
    assert texts(r) == {"x: size[0] 8 -> 16", "y: size[0] 8 -> 16"}
    for c in r["causes"]:
        assert c["line"] == f"{HERE}:{line_of('# the second call')}"
        assert c["code"].startswith("f(torch.randn(16), torch.randn(16))")
        assert c["read_at"] == f"{HERE}:{line_of('# reads x and y')}: return x + y  # reads x and y"


def test_each_entry_the_call_missed_gives_its_own_causes():
    f = torch.compile(add, backend="eager")
    y = torch.randn(1)

    def calls():
        f(torch.randn(8), y)
        f(torch.randn(8, dtype=torch.float64), y)
        f(torch.randn(8, dtype=torch.float16), y)

    first, second = recompiles(calls)
    assert texts(first) == {"x: dtype float32 -> float64"}
    assert texts(second, "0/1") == {"x: dtype float64 -> float16"}
    assert texts(second, "0/0") == {"x: dtype float32 -> float16"}


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.k = 2

    def forward(self, x):
        return self.lin(x) * self.k


def test_a_module_attribute_and_an_input_shape_are_named_by_the_users_names():
    m = Scaled()
    f = torch.compile(m, backend="eager")

    def calls():
        f(torch.randn(2, 4))
        m.k = 3
        f(torch.randn(3, 4))

    (r,) = recompiles(calls)
    assert texts(r) == {"self.k: 2 -> 3", "x: size[0] 2 -> 3"}


def test_the_report_lists_every_cause_under_the_call():
    f = torch.compile(scale, backend="eager")
    with gt_core.diagnostics():
        f(torch.randn(8), 3)
        f(torch.randn(16), 4)  # the recompiling call
    (u,) = gt_core.report().to_data()["user_compiles"]
    (rec,) = u["recompiles"]
    assert {cause_text(c) for c in rec["causes"]} == {"n: 3 -> 4", "x: size[0] 8 -> 16"}
    text = str(gt_core.report())
    head = f"    recompile {rec['compile_id']} at {HERE}:{line_of('# the recompiling call')}: "
    assert head in text
    assert f"      n: 3 -> 4  (read at {HERE}:{line_of('return x * n')})" in text
    assert "      x: size[0] 8 -> 16  (read at " in text
    assert u["recompile_reasons"] and u["explanations"]  # the reason-based view stays
    from gt_jupyter._explore._data import user_rows

    details = [r["detail"] for r in user_rows(u)]
    assert any(d.startswith("  n: 3 -> 4") for d in details)
    assert any(d.startswith("  x: size[0] 8 -> 16") for d in details)


def test_without_the_hook_a_recompile_keeps_its_reason_and_says_what_is_missing(monkeypatch):
    def missing(on_check):
        raise AttributeError("no get_and_maybe_log_recompilation_reasons")

    monkeypatch.setattr(torch_hooks, "hook_recompile_check", missing)
    f = torch.compile(scale, backend="eager")
    with gt_core.diagnostics():
        f(torch.randn(8), 3)
        f(torch.randn(8), 4)
    es = gt_core.events_log().snapshot()
    (r,) = [e for e in es if e["type"] == ev.USER_RECOMPILE]
    assert r["reason"] == "n == 3" and r["causes"] == []
    (fail,) = [e for e in es if e["type"] == ev.USER_FAILURE]
    assert fail["kind"] == "unavailable" and "every cause of a recompile" in fail["reason"]


def test_a_shape_guard_of_a_dynamic_entry_is_named_with_the_check_it_failed():
    f = torch.compile(lambda x: x * 2, backend="eager")

    def calls():
        f(torch.randn(8))
        f(torch.randn(16))  # entry 0/1: x's size dynamic, for sizes of 2 and more
        f(torch.randn(1))

    _, r = recompiles(calls)
    assert "2 <= x.size()[0]" in r["reason"]
    assert texts(r, "0/1") == {"x: size[0] is 1, fails 2 <= x.size()[0]"}
    assert texts(r, "0/0") == {"x: size[0] 8 -> 1"}


def test_requires_grad_and_a_stride_change_together_are_both_named():
    f = torch.compile(lambda x, w: x @ w, backend="eager")
    x = torch.randn(2, 3)

    def calls():
        f(x, torch.randn(3, 2))
        f(x.clone().requires_grad_(), torch.randn(2, 3).t())

    (r,) = recompiles(calls)
    assert "requires_grad" not in r["reason"]  # torch's own reason names the stride alone
    assert texts(r) == {
        "x: requires_grad False -> True",
        "w: stride[0] 2 -> 1",
        "w: stride[1] 1 -> 3",
    }
