"""gt's account of each cell of the corpus (tests/_cells.py) against torch's own account of it.

Each cell runs twice from a fresh Dynamo: once with torch's logs on (``recompiles_verbose``,
``graph_breaks``, the recompile-limit warning), its compile records and cache entries read
after it (the oracle), once under ``gt_core.diagnostics()``. The checks:

- counts: the compiles, graphs and recompiles gt reports are torch's, compile id by id;
- causes: each failing guard torch's verbose log names for a recompile is among gt's causes
  of that recompile, for the same cache entry, with its input's name and the cell's line
  where torch gives one; each cause gt names is true of that entry's guards;
- graph breaks, the recompile limit, failures and compile time: torch's, site by site, and
  so are the counts on each function's line of the text report;
- statements: each explanation's ``cause`` and ``fix`` is read by a checker of its kind,
  which holds it to what torch did; a fix that is mechanical (a config, ``dynamic=True``,
  ``mark_dynamic``, a change to each call's inputs) is applied to a re-run of the cell and
  must have the effect it promises. An explanation without a checker fails: no statement
  goes unread. No fix advises a setting the cell ran with already; each place an
  explanation names is one torch named.

Compile ids are the same in every run of a cell: each starts from ``torch._dynamo.reset()``.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import dataclass

import _cells
import pytest
import torch
from _cells import CELLS, HERE, Change, Run, run_cell, torch_run
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

import gt_core

RESUME = re.compile(r"^torch_dynamo_resume_in_")
NAMES = list(CELLS)


@pytest.fixture(autouse=True)
def fresh():
    torch._dynamo.reset()
    gt_core.reset()
    yield
    torch._dynamo.reset()


# -- the two runs of a cell ------------------------------------------------------------------
@functools.cache
def truth(name: str) -> Run:
    return torch_run(name)


@functools.cache
def rerun(name: str, config: tuple = (), change: Change | None = None) -> Run:
    """The cell re-run with a fix: ``config`` as sorted (key, value) pairs."""
    return torch_run(name, dict(config), change)


@dataclass
class Gt:
    data: list[dict]
    text: str
    error: BaseException | None
    metrics: list  # torch's compile records of the same run


@functools.cache
def gt(name: str) -> Gt:
    torch._dynamo.reset()
    gt_core.reset()
    clear_compilation_metrics()
    error = None
    try:
        with gt_core.diagnostics():
            run_cell(name)
    except Exception as exc:
        error = exc
    out = Gt(
        gt_core.report().to_data()["user_compiles"],
        str(gt_core.report()),
        error,
        get_compilation_metrics(),
    )
    torch._dynamo.reset()
    gt_core.reset()
    return out


# -- names and values as torch writes them ---------------------------------------------------
def user_names(text: str) -> str:
    """Guard text in the user's names: ``L['x']`` -> ``x``, ``G['N']`` -> ``N``,
    ``self._modules['lin']`` -> ``self.lin``."""
    text = re.sub(r"\b[LG]\['(\w+)'\]", r"\1", text)
    return re.sub(r"\._(?:modules|parameters|buffers)\['(\w+)'\]", r".\1", text)


def code_part(text: str) -> str:
    """A guard's check without its comment, spaces collapsed."""
    return re.sub(r"\s+", " ", text.split("#", 1)[0]).strip()


_DTYPES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16"}
_SIZE = re.compile(
    r"^tensor '(?P<name>[^']+)' (?P<what>size|stride) mismatch at index (?P<dim>\d+)\. "
    r"expected (?P<old>\d+), actual (?P<new>\d+)$"
)
_DTYPE = re.compile(
    r"^tensor '(?P<name>[^']+)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)$"
)
_GRAD = re.compile(
    r"^tensor '(?P<name>[^']+)' requires_grad mismatch\. expected requires_grad=(?P<old>[01])$"
)
_STATE = re.compile(r"^GLOBAL_STATE changed: (?P<name>\w+)")
_CHECK_TENSOR = re.compile(
    r"check_tensor\((?P<src>[^,]+), \w+, (?:DispatchKeySet\([^)]*\), )?torch\.(?P<dtype>\w+), "
    r"device=\w+, requires_grad=(?P<grad>True|False), size=\[(?P<size>[^\]]*)\], "
    r"stride=\[(?P<stride>[^\]]*)\]"
)


def agrees(cause: dict, failure: _cells.Failure) -> bool:
    """Whether gt's cause is the failing guard torch's log names."""
    text = failure.text
    if cause["entry"] != failure.entry:
        return False
    if m := _SIZE.match(text):
        want = (m["name"], f"{m['what']}[{m['dim']}]", int(m["old"]), int(m["new"]))
        return (cause["input"], cause["field"], cause["before"], cause["after"]) == want
    if m := _DTYPE.match(text):
        want = (m["name"], "dtype", _DTYPES[m["old"]], _DTYPES[m["new"]])
        return (cause["input"], cause["field"], cause["before"], cause["after"]) == want
    if m := _GRAD.match(text):
        want = (m["name"], "requires_grad", m["old"] == "1")
        return (cause["input"], cause["field"], cause["before"]) == want
    if m := _STATE.match(text):
        return cause["input"] == m["name"] and cause["guard"] == "GLOBAL_STATE"
    check = user_names(code_part(text))
    return cause["check"] == check or (
        not cause["field"] and f"{cause['input']} == {cause['before']}" == check
    )


def cell_line(failure: _cells.Failure) -> str | None:
    """``file:line`` in the cells' file that torch gives for a failing guard: the innermost
    frame of its user stack there, else its comment's, else None."""
    ours = [line for file, line in failure.stack if file == HERE]
    if ours:
        return f"{HERE}:{ours[-1]}"
    m = re.search(r"#\s*\S.*?\s+#\s*(?P<file>\S+):(?P<line>\d+) in ", failure.text)
    if m and HERE.endswith(m["file"]):
        return f"{HERE}:{m['line']}"
    return None


def source_line(where: str) -> str:
    file, line = where.rsplit(":", 1)
    with open(file) as f:
        return f.read().splitlines()[int(line) - 1].strip()


def order(cid: str) -> tuple[int, int]:
    """A compile id (``frame/compile``) as numbers, to order compiles."""
    frame, compile = cid.split("/")[:2]
    return int(frame), int(compile)


def recompiled_ids(t: Run) -> set[str]:
    """Compile ids of the recompiles that compiled (not refused at the limit or by a stance)."""
    made = {str(m.compile_id) for m in t.compiled()}
    return {c for c in t.recompiles() if c in made}


# -- counts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_compiles_graphs_and_recompiles_are_torchs(name):
    t, g = truth(name), gt(name)
    assert [str(m.compile_id) for m in g.metrics] == [str(m.compile_id) for m in t.metrics]
    made = {str(m.compile_id): m for m in t.compiled()}
    assert sorted(c for u in g.data for c in u["compile_ids"]) == sorted(made)
    for u in g.data:
        mine = [made[c] for c in u["compile_ids"]]
        assert u["compiles"] == sum(not RESUME.match(m.co_name) for m in mine), u["function"]
        assert u["graphs"] == sum(bool(m.graph_op_count) for m in mine)
        assert [r["compile_id"] for r in u["recompiles"]] == sorted(
            set(u["compile_ids"]) & recompiled_ids(t)
        )
    for c in set(t.recompiles()) - recompiled_ids(t):  # refused: at the limit, or an error
        assert c in {r.compile_id for r in t.limit_hits()} or t.error is not None


# -- causes ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_every_failing_guard_torch_names_is_a_cause_with_its_input_and_line(name):
    t, g = truth(name), gt(name)
    recs = {r["compile_id"]: r for u in g.data for r in u["recompiles"]}
    for cid in recompiled_ids(t):
        causes = recs[cid]["causes"]
        for failure in t.recompiles()[cid]:
            named = [c for c in causes if agrees(c, failure)]
            assert named, (cid, failure, causes)
            line = cell_line(failure)
            if line is not None:  # torch gives the cell's line: gt names it too
                assert any(c["read_at"].startswith(f"{line}: ") for c in named), (line, named)
        for c in causes:  # each named with its input and the user's call
            assert c["input"] and c["line"] == t.callers[cid], c
            assert c["code"] == source_line(c["line"])
            assert c["read_at"] or c["guard"] == "GLOBAL_STATE", c


def _tensor_guard(guards: list[str], input_name: str):
    for g in guards:
        m = _CHECK_TENSOR.search(g)
        if m and user_names(m["src"]) == input_name:
            return m
    return None


def cause_holds(cause: dict, guards: list[str]) -> bool:
    """Whether the cache entry (its guards) checks what gt says the call failed."""
    field, before = cause["field"], cause["before"]
    if cause["guard"] == "TENSOR_MATCH":
        m = _tensor_guard(guards, cause["input"])
        if m is None:
            return False
        if field == "dtype":
            return m["dtype"] == before
        if field == "requires_grad":
            return (m["grad"] == "True") == before
        what, _, dim = field.rstrip("]").partition("[")
        values = [None if v.strip() == "None" else int(v) for v in m[what].split(",")]
        return values[int(dim)] == before if dim else values == before
    if cause["guard"] == "GLOBAL_STATE":
        state = next(g for g in guards if g.startswith("GLOBAL_STATE"))
        return json.loads(state.split(" against ", 1)[1])[cause["input"]] == before
    checks = {user_names(code_part(g.split(": ", 1)[-1])) for g in guards}
    if cause["check"]:
        return cause["check"] in checks
    return f"{cause['input']} == {before}" in checks


@pytest.mark.parametrize("name", NAMES)
def test_each_cause_gt_names_is_a_guard_of_the_entry_it_names(name):
    t, g = truth(name), gt(name)
    for u in g.data:
        for r in u["recompiles"]:
            for c in r["causes"]:
                assert c["entry"] in t.entries, c  # a cache entry of that function, still there
                assert cause_holds(c, t.entries[c["entry"]]), (c, t.entries[c["entry"]])


# -- graph breaks, the limit, failures, compile time -----------------------------------------
def torch_breaks(t: Run) -> Counter:
    """file:line -> how often torch logged a graph break there; a break that raised (no log
    record of its compile) counts at the frame its compile record names."""
    sites = Counter()
    for b in t.breaks():
        m = re.search(r"in user code at (\S+):(\d+)", b.message)
        sites[f"{m[1]}:{m[2]}"] += 1
    logged = {b.compile_id for b in t.breaks()}
    for m in t.metrics:
        if m.fail_type == "Unsupported" and str(m.compile_id) not in logged:
            if "recompile limit" not in (m.fail_reason or ""):
                sites[f"{m.fail_user_frame_filename}:{m.fail_user_frame_lineno}"] += 1
    return sites


def torch_explanation(t: Run, site: str) -> str:
    for b in t.breaks():
        if f"in user code at {site}\n" in b.message + "\n":
            return re.search(r"Explanation: (.+)", b.message)[1].strip()
    m = next(
        m for m in t.metrics if f"{m.fail_user_frame_filename}:{m.fail_user_frame_lineno}" == site
    )
    return re.search(r"Explanation: (.+)", m.fail_reason)[1].strip()


@pytest.mark.parametrize("name", NAMES)
def test_graph_breaks_are_torchs_site_by_site(name):
    t, g = truth(name), gt(name)
    sites = Counter()
    for u in g.data:
        for b in u["graph_breaks"]:
            sites[b["where"]] += b["count"]
    assert sites == torch_breaks(t)
    for u in g.data:
        for b in u["graph_breaks"]:
            assert torch_explanation(t, b["where"]) in b["reason"], b


@pytest.mark.parametrize("name", NAMES)
def test_the_limit_is_reported_iff_torch_hit_it(name):
    t, g = truth(name), gt(name)
    hits = {
        r.compile_id.split("/")[0]: int(re.search(r"\((\d+)\)", r.message)[1])
        for r in t.limit_hits()
    }
    for u in g.data:
        frames = {c.split("/")[0] for c in u["compile_ids"]}
        hit = [hits[f] for f in frames if f in hits]
        assert u["limit_hit"] == bool(hit), u["function"]
        assert u["limit"] == (hit[0] if hit else None)
    assert sum(u["limit_hit"] for u in g.data) == len(hits)


def failure_kind(exc: BaseException | None) -> list[str]:
    if exc is None:
        return []
    if type(exc).__name__ == "RecompileError":
        return ["error_on_recompile"]
    if "fail_on_recompile" in str(exc):
        return ["fail_on_recompile"]
    return ["fullgraph"] if type(exc).__name__ == "Unsupported" else ["?"]


@pytest.mark.parametrize("name", NAMES)
def test_failures_are_what_torch_raised(name):
    t, g = truth(name), gt(name)
    assert type(g.error) is type(t.error)
    failures = [f for u in g.data for f in u["failures"]]
    assert [f.split(":", 1)[0] for f in failures] == failure_kind(t.error)
    refused = set(t.recompiles()) - recompiled_ids(t) - {r.compile_id for r in t.limit_hits()}
    for c in refused:  # a recompile made an error: its failing guards are in gt's failure
        for f in t.recompiles()[c]:
            assert any(f"- {f.entry}: {f.text}" in text for text in failures), (f, failures)


@pytest.mark.parametrize("name", NAMES)
def test_compile_time_is_torchs_compile_records(name):
    """gt's seconds are torch's own records of the same run (no clock is read here)."""
    g = gt(name)
    made = {str(m.compile_id): m for m in g.metrics if not m.fail_type}
    for u in g.data:
        mine = [made[c] for c in u["compile_ids"]]
        total = sum(m.entire_frame_compile_time_s for m in mine)
        dynamo = sum(
            max(m.entire_frame_compile_time_s - (m.backend_compile_time_s or 0), 0) for m in mine
        )
        assert u["compile_seconds"] == pytest.approx(total, abs=1e-5)
        assert u["time_split"]["dynamo_s"] == pytest.approx(dynamo, abs=1e-5)
        head = f"torch.compile {u['function']}: {u['compiles']} compile(s) in {u['compile_seconds']:.2f} s"
        assert head in g.text


@pytest.mark.parametrize("name", NAMES)
def test_the_report_line_of_each_function_counts_as_torch_does(name):
    t, g = truth(name), gt(name)
    lines = {
        ln.split(":", 1)[0].strip(): ln for ln in g.text.splitlines() if "torch.compile " in ln
    }
    for u in g.data:
        line = lines[f"torch.compile {u['function']}"]
        recompiles = len(set(u["compile_ids"]) & recompiled_ids(t))
        sites = {b["where"] for b in u["graph_breaks"]}
        assert f", {recompiles} recompile(s), {len(sites)} graph break(s)" in line
        assert line.endswith(", recompile limit hit") == u["limit_hit"]


@pytest.mark.parametrize("name", NAMES)
def test_each_functions_calls_ran_as_torch_ran_them(name):
    """How each call ran is torch's, counted from a re-run that watches every call with a
    counting backend: a call an exception left raised; one that made a compile is
    compiling; one that ran a graph and compiled nothing ran compiled (whole, partly, or as
    one of gt's eager samples, each taken where a cached graph would have run); one that did
    neither ran eagerly. The report's line says the same counts."""
    g = gt(name)
    watched = rerun(name, change=Change(count=True, watch=True)).calls
    for u in g.data:
        codes = Said(name, u, {}).codes()
        mine = [c for c in watched if c.code in codes]
        if not mine:
            continue  # (a function called only from other compiled code: traced, not called)
        c = u["calls"]
        assert c is not None, f"{u['function']}: no calls counted"
        got = Counter(c["outcomes"])
        ran = got["compiled"] + got["partly_eager"] + got["eager_sample"]
        raised = sum(1 for x in mine if x.raised)
        compiling = sum(1 for x in mine if x.compiles and not x.raised)
        graphs = sum(1 for x in mine if not (x.compiles or x.raised) and x.graph_runs)
        assert (got["raised"], got["compiling"], ran, got["eager"]) == (
            raised,
            compiling,
            graphs,
            len(mine) - raised - compiling - graphs,
        ), (u["function"], dict(got))
        assert c["calls"] == len(mine)
        assert f"{c['calls']} call(s): " in g.text
        assert got["eager_sample"] <= sum(1 for x in mine if x.fits and not x.compiles)


# -- statements ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """Before each call: ``torch._dynamo.mark_dynamic(input, dim)``."""

    name: str
    dim: int

    def __call__(self, inputs):
        torch._dynamo.mark_dynamic(inputs[self.name], self.dim)


@dataclass(frozen=True)
class MarkUnbacked:
    """Before each call: ``torch._dynamo.decorators.mark_unbacked(input, dim)``."""

    name: str
    dim: int

    def __call__(self, inputs):
        torch._dynamo.decorators.mark_unbacked(inputs[self.name], self.dim)


@dataclass(frozen=True)
class Cast:
    """Before each call: the input cast to one dtype."""

    name: str
    dtype: str

    def __call__(self, inputs):
        inputs[self.name] = inputs[self.name].to(getattr(torch, self.dtype))


@dataclass(frozen=True)
class Detach:
    name: str

    def __call__(self, inputs):
        inputs[self.name] = inputs[self.name].detach()


@dataclass(frozen=True)
class Contiguous:
    name: str

    def __call__(self, inputs):
        inputs[self.name] = inputs[self.name].contiguous()


@dataclass(frozen=True)
class ToTensor:
    """Before each call: a Python number passed as a 0-d tensor."""

    name: str

    def __call__(self, inputs):
        inputs[self.name] = torch.tensor(inputs[self.name])


@dataclass(frozen=True)
class OneMode:
    """Each call under one grad mode."""

    grad: bool

    def __call__(self, inputs):
        return torch.set_grad_enabled(self.grad)


@dataclass
class Said:
    """One explanation gt gave for a function of a cell."""

    name: str
    u: dict
    x: dict

    @property
    def t(self) -> Run:
        return truth(self.name)

    def codes(self) -> set[str]:
        """The code names of the function's own compiles (not its resume functions)."""
        made = {str(m.compile_id): m for m in self.t.compiled()}
        return {made[c].co_name for c in self.u["compile_ids"] if not RESUME.match(made[c].co_name)}

    def compiles(self, run: Run) -> int:
        codes = self.codes()
        return sum(m.co_name in codes for m in run.compiled())

    def calls(self) -> list[_cells.Call]:
        return rerun(self.name, change=Change(watch=True)).calls

    def seen(self, name: str) -> list:
        """Each call's ``name`` input, as :func:`_cells.summary` writes it."""
        return [c.inputs[name] for c in self.calls() if name in c.inputs]

    def fixed(self, config: dict | None = None, **change) -> Run:
        """The cell re-run with a fix; it must run (a fix that raises is no fix)."""
        r = rerun(self.name, tuple(sorted((config or {}).items())), Change(**change))
        assert r.error is None, (config, change, r.error)
        return r

    def entries(self) -> dict[str, list[str]]:
        """The function's cache entries after the cell: compile id -> guards."""
        return {c: self.t.entries[c] for c in self.u["compile_ids"] if c in self.t.entries}

    def entries_in(self, run: Run) -> list[list[str]]:
        """The guards of each cache entry of the function's code after ``run``."""
        codes = self.codes()
        return [g for c, g in run.entries.items() if run.entry_code[c] in codes]

    def removes(self, run: Run, value, this) -> None:
        """A fix of one cause (``this(cause)``: whether one of gt's causes is it): the re-run
        compiled no more than the cell did, and what the cause names no longer differs
        between the function's entries (``value(guards)``, one per entry; None: an entry that
        another cause made), so it recompiles nothing; where it was the only cause of its
        recompiles, fewer compiles."""
        assert self.compiles(run) <= self.compiles(self.t)
        values = {value(g) for g in self.entries_in(run)} - {None}
        assert len(values) == 1, self.entries_in(run)
        mine = [r for r in self.u["recompiles"] if any(this(c) for c in self.causes_of(r))]
        assert mine
        if all(all(this(c) for c in self.causes_of(r)) for r in mine):
            assert self.compiles(run) < self.compiles(self.t)

    def causes_of(self, recompile: dict) -> list[dict]:
        """Its causes that failed every entry the call tried (what made it compile)."""
        entries = {c["entry"] for c in recompile["causes"]}
        by = {}
        for c in recompile["causes"]:
            by.setdefault((c["input"], c["field"]), set()).add(c["entry"])
        return [c for c in recompile["causes"] if by[(c["input"], c["field"])] == entries]

    def failures(self) -> dict[str, list[_cells.Failure]]:
        return {c: f for c, f in self.t.recompiles().items() if c in self.u["compile_ids"]}


def size_at(guards: list[str], name: str, dim: int) -> int | None:
    """The size an entry's tensor guard fixes ``name``'s ``dim`` to (None: dynamic)."""
    size = _tensor_guard(guards, name)["size"].split(",")[dim].strip()
    return None if size == "None" else int(size)


def global_state(guards: list[str]) -> dict:
    state = next(g for g in guards if g.startswith("GLOBAL_STATE"))
    return json.loads(state.split(" against ", 1)[1])


def before_after(values: list, old, new) -> bool:
    """Whether ``old`` was seen in a call before one that saw ``new``."""
    return old in values and new in values[values.index(old) + 1 :]


def value_guards(s: Said, expr: str) -> list[str]:
    """The numbers the function's cache entries hold ``expr`` to (``expr == 3``)."""
    held = re.compile(r"(?<![\w.\]'])" + re.escape(user_names(expr)) + r" == (-?[\d.e-]+)$")
    out = []
    for guards in s.entries().values():
        for g in guards:
            m = held.search(user_names(code_part(g.split(": ", 1)[-1])))
            if m:
                out.append(m[1])
    return out


def site_lines(s: Said) -> list[str]:
    return [source_line(b["where"]) for b in s.u["graph_breaks"] if b["where"]]


def breaks_at(run: Run, lines: list[str]) -> int:
    """How many of torch's graph breaks in ``run`` are on one of these source lines."""
    return sum(source_line(where) in lines for where in torch_breaks(run).elements())


def split(s: Said) -> bool:
    """Whether the function's graph was split: a resume function after a break compiled."""
    return any(RESUME.match(m.co_name) for m in s.t.compiled())


STATE = torch.tensor(1)


def _times_state(x):
    return x * STATE


@functools.cache
def state_tensor_compiles() -> int:
    """Compiles of a function reading a global 0-d tensor updated in place to 4 values."""
    torch._dynamo.reset()
    clear_compilation_metrics()
    f = torch.compile(_times_state, backend="eager")
    for v in (1, 2, 3, 4):
        STATE.fill_(v)
        f(torch.ones(3))
    made = [m for m in get_compilation_metrics() if not m.fail_type]
    torch._dynamo.reset()
    return len(made)


CHECKS: dict = {}


def checks(*ids):
    def register(fn):
        for i in ids:
            CHECKS[i] = fn
        return fn

    return register


@checks("shape_change")
def _shape_change(s: Said):
    m = re.fullmatch(
        r"input `(?P<name>[^`]+)` changed shape: dimension (?P<dim>\d+) was (?P<old>\d+), "
        r"now (?P<new>\d+)",
        s.x["cause"],
    )
    name, dim = m["name"], int(m["dim"])
    sizes = [v[0][dim] for v in s.seen(name)]
    assert before_after(sizes, int(m["old"]), int(m["new"])), sizes
    assert s.x["fix"] == (
        f"compile with `dynamic=True`, or call `torch._dynamo.mark_dynamic({name}, {dim})` "
        "before the first call; or pad inputs to a few fixed sizes (buckets)"
    )

    def size(guards):
        n = size_at(guards, name, dim)  # (None: dynamic; 0 and 1: the size_one cause's)
        return "dynamic" if n is None else None if n in (0, 1) else n

    def this(c):
        return (c["input"], c["field"]) == (name, f"size[{dim}]")

    s.removes(s.fixed(compile=(("dynamic", True),)), size, this)
    s.removes(s.fixed(before=Mark(name, dim)), size, this)


@checks("size_one")
def _size_one(s: Said):
    m = re.fullmatch(
        r"input `(?P<name>[^`]+)` has a size of 0 or 1 at dimension (?P<dim>\d+): torch keeps "
        r"those sizes apart \(a dynamic size is one of 2 or more\), so it compiles a graph for "
        r"that size",
        s.x["cause"],
    )
    name, dim = m["name"], int(m["dim"])
    assert {0, 1} & {v[0][dim] for v in s.seen(name)}
    static = [size_at(g, name, dim) for g in s.entries().values()]
    small = [n for n in static if n in (0, 1)]
    assert small and len(small) == len(set(small)), static  # a graph for it, once
    dynamic = s.fixed(compile=(("dynamic", True),))  # what a dynamic size is on this torch
    ranges = {
        user_names(code_part(g.split(": ", 1)[-1])) for gs in s.entries_in(dynamic) for g in gs
    }
    assert f"2 <= {name}.size()[{dim}]" in ranges, ranges
    assert s.x["fix"] == (
        "expected once per such size; to share one graph, call "
        f"`torch._dynamo.decorators.mark_unbacked({name}, {dim})` before the first call (torch "
        "then assumes nothing of that size)"
    )
    assert s.compiles(s.fixed(before=MarkUnbacked(name, dim))) < s.compiles(s.t)


@checks("shape_kept_static")
def _shape_kept_static(s: Said):
    m = re.fullmatch(
        r"input `(?P<name>[^`]+)` changed shape: dimension (?P<dim>\d+) was (?P<old>\d+), "
        r"now (?P<new>\d+); torch kept that dimension static \((?P<n>\d+) graphs? so far\): "
        r"the code needs it as a Python int \(a loop count, `range`, a branch on the size\), so "
        r"each new size needs a graph of its own and `dynamic=True` would not help",
        s.x["cause"],
    )
    name, dim = m["name"], int(m["dim"])
    assert before_after([v[0][dim] for v in s.seen(name)], int(m["old"]), int(m["new"]))
    static = []
    for guards in s.entries().values():
        t = _tensor_guard(guards, name)
        size = t["size"].split(",")[dim].strip() if t else "None"
        if size != "None":
            static.append(int(size))
    assert int(m["n"]) == len(static) == len(set(static)), static  # one graph per size
    assert s.compiles(s.fixed(compile=(("dynamic", True),))) >= s.compiles(s.t)
    assert s.x["fix"] == (
        "expected if it takes a few sizes (each compiles once); with many, pad inputs to a few "
        "fixed sizes (buckets), or keep the loop or branch on the size outside the compiled "
        "function"
    )


@checks("dtype_change")
def _dtype_change(s: Said):
    m = re.fullmatch(
        r"input `(?P<name>[^`]+)` changed dtype: (?P<old>\w+) → (?P<new>\w+)", s.x["cause"]
    )
    dtypes = [v[1] for v in s.seen(m["name"])]
    assert before_after(dtypes, _DTYPES[m["old"]], _DTYPES[m["new"]]), dtypes
    assert s.x["fix"] == "cast inputs to one dtype before the call"
    s.removes(
        s.fixed(before=Cast(m["name"], dtypes[0])),
        lambda g: _tensor_guard(g, m["name"])["dtype"],
        lambda c: (c["input"], c["field"]) == (m["name"], "dtype"),
    )


@checks("stride_change")
def _stride_change(s: Said):
    m = re.fullmatch(
        r"input `(?P<name>[^`]+)` changed strides \(a transposed, sliced or non-contiguous "
        r"tensor\)",
        s.x["cause"],
    )
    name = m["name"]
    assert len({v[3] for v in s.seen(name)}) == 2  # contiguous, then not
    assert s.x["fix"] == f"pass `{name}.contiguous()`, or build it the same way on every call"
    s.removes(
        s.fixed(before=Contiguous(name)),
        lambda g: _tensor_guard(g, name)["stride"],
        lambda c: c["input"] == name and c["field"].startswith("stride"),
    )


@checks("requires_grad_change")
def _requires_grad_change(s: Said):
    m = re.fullmatch(r"input `(?P<name>[^`]+)` changed requires_grad", s.x["cause"])
    assert len({v[2] for v in s.seen(m["name"])}) == 2
    assert (
        s.x["fix"] == "pass it the same way every call: `.detach()` it, or set requires_grad once"
    )
    s.removes(
        s.fixed(before=Detach(m["name"])),
        lambda g: _tensor_guard(g, m["name"])["grad"],
        lambda c: (c["input"], c["field"]) == (m["name"], "requires_grad"),
    )


def _once_per_mode(modes: list, calls: list[_cells.Call]) -> None:
    """Each mode compiled at its first call only: later calls reused its graph."""
    assert len(set(modes)) > 1
    for i, (mode, call) in enumerate(zip(modes, calls, strict=True)):
        assert bool(call.compiles) == (mode not in modes[:i]), (modes, calls)


@checks("grad_mode_change")
def _grad_mode_change(s: Said):
    assert s.x["cause"] == (
        "grad mode changed: the function was called both under `torch.no_grad()` and outside"
    )
    calls = s.calls()
    _once_per_mode([c.grad for c in calls], calls)
    assert s.x["fix"] == (
        "expected if it runs both ways: each grad mode compiles once and later calls reuse its "
        "graph; to save that recompile, call it under one mode"
    )
    s.removes(
        s.fixed(before=OneMode(calls[0].grad)),
        lambda g: global_state(g)["grad_mode"],
        lambda c: c["input"] == "grad_mode",
    )


@checks("train_eval_switch")
def _train_eval_switch(s: Said):
    m = re.fullmatch(
        r"a module switched between train\(\) and eval\(\) \(`(?P<expr>.+)\.training` was "
        r"(?P<value>True|False)\)",
        s.x["cause"],
    )
    guards = {
        user_names(code_part(g.split(": ", 1)[-1])) for gs in s.entries().values() for g in gs
    }
    assert f"{user_names(m['expr'])}.training == {m['value']}" in guards
    calls = s.calls()
    _once_per_mode([c.training for c in calls], calls)
    assert s.x["fix"] == "nothing to do: each mode compiles once and later switches reuse its graph"


def _value_recompiles(s: Said, expr: str, value: str) -> list[str]:
    """The recompiles whose failing guards (torch's log) include ``expr == value``."""
    want = f"{expr} == {value}"
    return [c for c, fs in s.failures().items() if any(code_part(f.text) == want for f in fs)]


@checks("value_made_dynamic")
def _value_made_dynamic(s: Said):
    m = re.fullmatch(
        r"`(?P<expr>.+)` changed \(it was (?P<value>\S+)\): torch compiled the new graph with it "
        r"dynamic \(automatic dynamic shapes\), so its later values reuse that graph",
        s.x["cause"],
    )
    expr, value = m["expr"], m["value"]
    (cid,) = _value_recompiles(s, expr, value)  # "that one recompile is the whole cost"
    assert value_guards(s, expr) == [value]  # only the first graph holds it to a number
    assert not any(
        expr in code_part(f.text)
        for c, fs in s.failures().items()
        if order(c) > order(cid)
        for f in fs
    )
    f = re.fullmatch(
        r"nothing to do: that one recompile is the whole cost \(to avoid it, (?P<how>.+)\)",
        s.x["fix"],
    )
    base = s.compiles(s.t)
    if f["how"] == "compile with `dynamic=True`":
        assert s.compiles(s.fixed(compile=(("dynamic", True),))) == base - 1
    else:
        assert f["how"] == "pass it as a 0-d tensor"
        arg = user_names(expr)
        if s.seen(arg):  # an argument: passed as a tensor (a global's reads are the cell's code)
            assert s.compiles(s.fixed(before=ToTensor(arg))) == base - 1


_SPECIALIZED = {
    "int_argument": (
        r"a guard on the Python int argument `(?P<expr>.+)` failed \(it was (?P<value>-?\d+)\), "
        r"so the function was compiled again",
        "; it steers Python control flow or a size torch must know (a loop count, `range`, a "
        "shape), so `dynamic=True` would not help",
    ),
    "int_from_mutable_state": (
        r"a guard on a Python int read from mutable state failed: `(?P<expr>.+)` was "
        r"(?P<value>-?\d+) when the graph was compiled",
        "; torch reads an int of an object or a global as a constant, so `dynamic=True` would "
        "not help",
    ),
    "float_constant": (
        r"a guard on the Python float `(?P<expr>.+)` failed \(it was (?P<value>[\d.e-]+)\), so "
        r"the function was compiled again \(learning rates, schedules, bias corrections\)",
        None,
    ),
}


@checks(*_SPECIALIZED)
def _specialized_value(s: Said):
    head, why = _SPECIALIZED[s.x["id"]]
    m = re.fullmatch(
        head + r"; torch kept it specialized \((?P<n>\d+) graphs? so far\): each new value needs "
        r"a graph of its own(?P<why>.*)",
        s.x["cause"],
    )
    expr, value = m["expr"], m["value"]
    assert _value_recompiles(s, expr, value), s.failures()  # torch's guard, failed
    held = value_guards(s, expr)
    assert int(m["n"]) == len(held) == len(set(held)), held  # a graph per value, each once
    assert value in held
    base = s.compiles(s.t)
    specialize_float = any(mm.specialize_float for mm in s.t.compiled())
    if why is None:
        assert m["why"] == (" (`specialize_float` was on)" if specialize_float else "")
    else:
        assert m["why"] == why
        assert s.compiles(s.fixed(compile=(("dynamic", True),))) >= base  # would not help
    if s.x["id"] == "int_argument":
        assert s.x["fix"] == (
            "expected if it takes a few values (each compiles once); with many, call it with a "
            "few fixed values (buckets), or keep the loop or branch on it outside the compiled "
            "function"
        )
    elif s.x["id"] == "int_from_mutable_state":
        lines = [source_line(cell_line(f)) for fs in s.failures().values() for f in fs]
        branches = [bool(re.match(r"(if|elif|while) ", line)) for line in lines if line]
        if s.x["fix"].startswith("keep it in a 0-d tensor (e.g. "):  # and replace the branch
            assert all(branches) and branches, lines
        else:
            name = user_names(expr)
            assert s.x["fix"] == (
                f"keep it in a 0-d tensor updated in place (`{name} = torch.tensor({value})`, "
                f"then `{name}.fill_(v)` or `{name}.add_(1)`): a tensor's value is an input of "
                "the graph, so a new value compiles nothing"
            )
            assert not any(branches), lines
            assert state_tensor_compiles() == 1
    else:
        fix = "pass it as a 0-d tensor instead of a Python float"
        if specialize_float:
            fix += " (or set `torch._dynamo.config.specialize_float = False`)"
            assert s.compiles(s.fixed({"specialize_float": False})) < base
        assert s.x["fix"] == fix
        arg = user_names(expr)
        if s.seen(arg):
            assert s.compiles(s.fixed(before=ToTensor(arg))) < base


@checks("length_change")
def _length_change(s: Said):
    m = re.fullmatch(
        r"the length of `(?P<expr>.+)` changed \(it was (?P<value>\d+)\)", s.x["cause"]
    )
    lengths = [v[1] for v in s.seen(m["expr"])]
    assert int(m["value"]) in lengths and len(set(lengths)) > 1
    assert s.x["fix"] == "pass a tensor, or a container of fixed length"


@checks("constant_value")
def _constant_value(s: Said):
    m = re.fullmatch(
        r"a guard on the constant `(?P<expr>.+)` \(it was (?P<value>.+)\): each distinct value "
        r"has its own graph",
        s.x["cause"],
    )
    held = [
        user_names(code_part(g.split(": ", 1)[-1])).split(" == ", 1)[1]
        for gs in s.entries().values()
        for g in gs
        if user_names(code_part(g.split(": ", 1)[-1])).startswith(f"{user_names(m['expr'])} == ")
    ]
    assert m["value"] in held and len(held) == len(set(held)) == len(s.entries()), held
    assert s.x["fix"] == "expected when it takes few values; otherwise pass the value as a tensor"


@checks("recompile_limit")
def _recompile_limit(s: Said):
    m = re.fullmatch(
        r"the recompile limit \((?P<limit>\d+)\) was hit: no new graph is compiled for this "
        r"function; a call whose inputs pass the guards of one of its cached graphs still runs "
        r"compiled, every other call runs eagerly \(uncompiled\)",
        s.x["cause"],
    )
    (hit,) = s.t.limit_hits()
    assert f"({m['limit']})" in hit.message
    calls = s.fixed(count=True).calls
    refused = next(i for i, c in enumerate(calls) if not c.compiles and not c.fits)
    assert refused < len(calls) - 1  # calls after the hit, some of them fitting a graph
    assert any(c.fits for c in calls[refused:])
    for c in calls[refused:]:
        assert not c.compiles and bool(c.graph_runs) == c.fits, calls
    assert s.x["fix"] == (
        "fix the cause of its recompiles (above); raising `torch._dynamo.config.recompile_limit` "
        "keeps more graphs, one per new value, so it helps only while the values are few"
    )
    more = s.fixed({"recompile_limit": 64})
    assert not more.limit_hits() and s.compiles(more) > s.compiles(s.t)


@checks("recompile_budget")
def _recompile_budget(s: Said):
    m = re.fullmatch(
        r"(?P<fn>\w+): (?P<used>\d+) of the (?P<limit>\d+) graphs `recompile_limit` allows "
        r"compiled \((?P<then>.+) hits the limit: calls that need a new graph then run eagerly\)",
        s.x["cause"],
    )
    used, limit = int(m["used"]), int(m["limit"])
    assert used == len(s.entries()) == s.compiles(s.t)
    assert limit == json.loads(s.t.compiled()[-1].dynamo_config)["recompile_limit"]
    left = limit - used  # torch compiles while a function has fewer entries than the limit
    assert m["then"] == ("the next recompile" if left <= 0 else f"{left} more and the next")
    assert s.x["fix"] == (
        "fix the cause of the recompiles before the limit is hit: then calls that need a new "
        "graph run eagerly"
    )


@checks("fail_on_recompile")
def _fail_on_recompile(s: Said):
    assert s.x["cause"] == (
        "a recompile was made an error (`set_stance('fail_on_recompile')` or "
        "`torch._dynamo.config.error_on_recompile`)"
    )
    assert failure_kind(s.t.error)[0] in ("fail_on_recompile", "error_on_recompile")
    assert (
        s.x["fix"]
        == "the guard failure in the message names the cause; fix it, or leave that stance"
    )
    assert re.search(
        r"guard failure\(s\):\s+(?:guard \d+ failures:\s+)?- \d+/\d+: ", str(s.t.error)
    )


@checks("fullgraph")
def _fullgraph(s: Said):
    assert s.x["cause"] == "with fullgraph=True a graph break is an error, so the call raised"
    assert failure_kind(s.t.error) == ["fullgraph"]
    assert any(kw.get("fullgraph") for kw in s.t.compile_kwargs)
    assert s.x["fix"] == "remove the graph break named with it, or compile without fullgraph=True"
    s.fixed(compile=(("fullgraph", False),))  # (runs)


@checks("print")
def _print(s: Said):
    m = re.fullmatch(
        r"`print` inside the compiled function (?P<effect>splits the graph|breaks the graph, an "
        r"error under fullgraph=True)",
        s.x["cause"],
    )
    lines = site_lines(s)
    assert any(line.startswith("print(") for line in lines), lines
    if m["effect"] == "splits the graph":
        assert split(s)
    else:
        assert failure_kind(s.t.error) == ["fullgraph"] and not split(s)
    fixed = s.fixed({"reorderable_logging_functions": frozenset({print})})
    if s.x["fix"] == (
        "move the print out of the compiled function (print its results after the call), or "
        "`torch._dynamo.config.reorderable_logging_functions.add(print)`"
    ):
        assert not breaks_at(fixed, lines)
    else:
        f = re.fullmatch(
            r"move the print out of the compiled function \(print its results after the call\); "
            r"`torch\._dynamo\.config\.reorderable_logging_functions` cannot take it: it prints "
            r"a (?P<types>.+), and only calls on tensors and constants can be reordered",
            s.x["fix"],
        )
        for t in re.findall(r"`(\w+)`", f["types"]):
            assert any(f"'{t}'" in b.message for b in s.t.breaks())  # torch names its type
        assert breaks_at(fixed, lines) == breaks_at(s.t, lines)  # the breaks stay


@checks("item")
def _item(s: Said):
    m = re.fullmatch(
        r"`\.item\(\)` reads a tensor's value into Python, which (?P<effect>splits the graph|"
        r"breaks the graph, an error under fullgraph=True)",
        s.x["cause"],
    )
    lines = site_lines(s)
    assert any(".item()" in line for line in lines), lines
    assert m["effect"] == "splits the graph" and split(s)
    assert s.x["fix"] == (
        "keep the value as a tensor; or, where only tensor ops use it, set "
        "`torch._dynamo.config.capture_scalar_outputs = True` (a Python `if` or loop on it "
        "breaks the graph still)"
    )
    fixed = s.fixed({"capture_scalar_outputs": True})
    assert not breaks_at(fixed, lines) and not any(
        RESUME.match(m.co_name) for m in fixed.compiled()
    )


@checks("item_steers_python")
def _item_steers_python(s: Said):
    m = re.fullmatch(
        r"a tensor's value decides a Python `if` or loop \(`(?P<line>.+)`\), which splits the "
        r"graph whatever `capture_scalar_outputs` says",
        s.x["cause"],
    )
    assert m["line"] in site_lines(s) and re.match(r"(if|elif|while) ", m["line"])
    assert split(s)
    fixed = s.fixed({"capture_scalar_outputs": True})
    assert any(RESUME.match(m.co_name) for m in fixed.compiled())  # the break stays
    assert s.x["fix"] == (
        "compute both sides and pick with `torch.where(cond, a, b)`, or use `torch.cond`; or "
        "move the branch out of the compiled function"
    )


@checks("explicit_break")
def _explicit_break(s: Said):
    assert s.x["cause"] == "an explicit `torch._dynamo.graph_break()`"
    assert any("torch._dynamo.graph_break()" in line for line in site_lines(s))
    assert s.x["fix"] == "remove it once you no longer need the split" and split(s)


@checks("data_dependent_branch")
def _data_dependent_branch(s: Said):
    assert s.x["cause"] == "a Python `if` on a tensor's value"
    assert all(line.startswith("if ") for line in site_lines(s))
    assert any("data-dependent branching" in b.message for b in s.t.breaks())
    assert s.x["fix"] == "replace the branch by `torch.where` (both sides computed) or `torch.cond`"


@checks("break_in_loop", "frame_skipped")
def _frame_skipped(s: Said):
    loop = s.x["id"] == "break_in_loop"
    cause = (
        "a graph break inside a `for`/`while` loop: torch cannot resume a graph in a loop, so it "
        "skips the whole function, which runs eagerly (uncompiled) on every call"
        if loop
        else "a graph break torch could not resume from: it skips the whole function, which runs "
        "eagerly (uncompiled) on every call"
    )
    assert s.x["cause"] == cause
    messages = [b.message for b in s.t.breaks()]
    assert any("Skipping the function and falling back to eager" in m for m in messages)
    assert not loop or any("graph break in loop" in m for m in messages)
    assert s.u["compiles"] == 0 and not s.t.entries  # no graph, ever
    tried = [m for m in s.t.metrics if m.co_name == s.u["function"]]
    assert len(tried) == 1 and len(s.calls()) > 1  # tried once; each call since ran eagerly
    assert s.x["fix"] == (
        "move what breaks the graph (a `print`, an `.item()`, a call torch cannot trace) out of "
        "the loop, or the loop out of the compiled function"
        if loop
        else "remove the graph break named with it, or move it out of the compiled function"
    )


def torch_places(t: Run) -> set[str]:
    """Every file:line torch's logs and records of a run name: break sites, the frames of
    failing guards' user stacks and their comments, the frames of the limit warning."""
    places = set(torch_breaks(t))
    for fs in t.recompiles().values():
        for f in fs:
            places |= {f"{file}:{line}" for file, line in f.stack}
            places |= {cell_line(f)} - {None}
    for r in t.limit_hits():
        places |= {f"{m[1]}:{m[2]}" for m in re.finditer(r'File "([^"]+)", line (\d+)', r.message)}
    for m in t.metrics:
        places |= {
            f"{file}:{line}"
            for file, line in re.findall(r'File "([^"]+)", line (\d+)', m.recompile_reason or "")
        }
    return places


def advice_already_in_force(t: Run, fix: str) -> list[str]:
    """The settings a fix advises that the cell ran with already: a config at that value in
    torch's compile records, ``dynamic=True`` where torch.compile was given it."""
    config = json.loads(t.metrics[-1].dynamo_config) if t.metrics else {}
    out = [
        f"{k} = {v}"
        for k, v in re.findall(r"torch\._dynamo\.config\.(\w+) = (True|False|\d+)", fix)
        if str(config.get(k)) == v
    ]
    if "compile with `dynamic=True`" in fix and any(kw.get("dynamic") for kw in t.compile_kwargs):
        out.append("dynamic=True")
    return out


@pytest.mark.parametrize("name", NAMES)
def test_no_fix_advises_what_the_cell_ran_with(name):
    for u in gt(name).data:
        for x in u["explanations"]:
            assert not advice_already_in_force(truth(name), x["fix"]), x


@pytest.mark.parametrize("name", NAMES)
def test_no_false_statement(name):
    for u in gt(name).data:
        for x in u["explanations"]:
            assert x["id"] in CHECKS, f"no checker reads {x['id']}: {x['cause']!r}"
            CHECKS[x["id"]](Said(name, u, x))
            assert not x["where"] or x["where"] in torch_places(truth(name)), (
                x
            )  # a place torch named
