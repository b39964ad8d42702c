"""A corpus of torch.compile cells as a user writes them, and what torch itself says of each.

Each cell is a small scenario: a function or module compiled with ``torch.compile(...,
backend="eager")`` and called in a loop with changing inputs. :func:`torch_run` runs a cell
with torch's own logs on (``recompiles_verbose``, ``graph_breaks``, the recompile-limit
warning) and reads torch's compile records and cache entries after it: the ground truth the
tests hold gt's report to. The same function re-runs a cell with a fix applied (a config
patch, other ``torch.compile`` arguments, a change to each call's inputs), so that a fix gt
advises can be tried on the cell it was advised for.

Cells call ``torch.compile`` by its name, as users do; a re-run replaces ``torch.compile``
for its length (``torch.nn.Module.compile`` calls it too), never the cell's code.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import sys
import types
from dataclasses import dataclass, field

import torch
from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import clear_compilation_metrics, get_compilation_metrics

HERE = __file__
REAL_COMPILE = torch.compile
CELLS: dict[str, types.FunctionType] = {}
CONFIG: dict[str, dict] = {}  # a cell's torch._dynamo.config, as its user set it beforehand


def cell(fn=None, *, config: dict | None = None):
    """Register a cell (its name: the pytest id); ``config``: the config it runs under."""
    if fn is None:
        return lambda f: cell(f, config=config)
    CELLS[fn.__name__] = fn
    CONFIG[fn.__name__] = config or {}
    return fn


# -- recompiles: shapes ----------------------------------------------------------------------
@cell
def shape_dim0():
    def step(x):
        return x * 2

    f = torch.compile(step, backend="eager")
    for n in (4, 8, 16, 32):
        f(torch.randn(n))


@cell
def shape_other_dim():
    def step(x):
        return x.sum(0)

    f = torch.compile(step, backend="eager")
    for n in (3, 5, 7):
        f(torch.randn(4, n))


@cell
def dynamic_true():
    def step(x):
        return x.cos() + 1

    f = torch.compile(step, backend="eager", dynamic=True)
    for n in (3, 5, 7, 9):
        f(torch.randn(n, 2))


@cell
def dynamic_true_size_one():
    def step(x):
        return x.cos() + 1

    f = torch.compile(step, backend="eager", dynamic=True)
    for n in (3, 5, 1):
        f(torch.randn(n, 2))


@cell
def dynamic_size_one():
    def step(x):
        return x * 2

    f = torch.compile(step, backend="eager")
    for n in (4, 8, 16, 1):
        f(torch.randn(n))


@cell
def dynamic_false():
    def step(x):
        return x.cos() + 1

    f = torch.compile(step, backend="eager", dynamic=False)
    for n in (3, 5, 7):
        f(torch.randn(n, 2))


@cell
def mark_dynamic():
    def step(x):
        return x.relu()

    f = torch.compile(step, backend="eager")
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        torch._dynamo.mark_dynamic(x, 0)
        f(x)
    f(torch.randn(3, 6))  # the other dimension changes


@cell
def shape_loop_count():
    def step(x):
        for i in range(x.shape[0]):
            x = x + i
        return x

    f = torch.compile(step, backend="eager")
    for n in (2, 3, 4):
        f(torch.ones(n))


@cell
def module_batch():
    model = torch.nn.Linear(4, 2)
    f = torch.compile(model, backend="eager")
    for n in (2, 4, 8):
        f(torch.randn(n, 4))


# -- recompiles: dtypes, requires_grad, grad mode, train/eval --------------------------------
@cell
def dtype_change():
    def step(x):
        return x + 1

    f = torch.compile(step, backend="eager")
    for dtype in (torch.float32, torch.float64, torch.float16):
        f(torch.ones(4, dtype=dtype))


@cell
def requires_grad_change():
    def step(x, w):
        return (x * w).sum()

    f = torch.compile(step, backend="eager")
    x = torch.randn(4)
    f(x, torch.randn(4))
    f(x, torch.randn(4, requires_grad=True))


@cell
def stride_change():
    def step(w):
        return torch.ones(2, 3) @ w

    f = torch.compile(step, backend="eager")
    f(torch.randn(3, 2))
    f(torch.randn(2, 3).t())  # the same shape, transposed


@cell
def grad_mode():
    def step(x):
        return x * 3

    f = torch.compile(step, backend="eager")
    f(torch.randn(4))
    with torch.no_grad():
        f(torch.randn(4))
    f(torch.randn(4))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.lin(x))  # Net's dropout


@cell
def train_eval():
    model = Net()
    f = torch.compile(model, backend="eager")
    x = torch.randn(2, 4)
    for _ in range(2):
        model.train()
        f(x)
        model.eval()
        f(x)


# -- recompiles: Python values ---------------------------------------------------------------
STEPS = 1
SCALE = 0.5
FLAG = True


class Config:
    n = 1


CFG = Config()


def times_steps(x):
    return x * STEPS


def times_scale(x):
    return x * SCALE


def flagged(x):
    if FLAG:
        return x + 1
    return x - 1


def times_cfg(x):
    return x * CFG.n


@cell
def global_int():
    global STEPS
    f = torch.compile(times_steps, backend="eager")
    for STEPS in (1, 2, 3, 4):  # noqa: B007 (the global the function reads)
        f(torch.ones(3))


@cell
def global_float():
    global SCALE
    f = torch.compile(times_scale, backend="eager")
    for SCALE in (0.5, 0.25, 0.125):  # noqa: B007
        f(torch.ones(3))


@cell
def global_bool():
    global FLAG
    f = torch.compile(flagged, backend="eager")
    for FLAG in (True, False, True, False):  # noqa: B007
        f(torch.ones(3))


@cell
def global_object_attribute():
    f = torch.compile(times_cfg, backend="eager")
    for n in (1, 2, 3, 4):
        CFG.n = n
        f(torch.ones(3))


@cell
def object_attribute():
    cfg = Config()

    def step(x):
        return x * cfg.n

    f = torch.compile(step, backend="eager")
    for n in (1, 2, 3, 4):
        cfg.n = n
        f(torch.ones(3))


@cell
def int_argument():
    def step(x, n):
        return x * n

    f = torch.compile(step, backend="eager")
    for n in range(1, 7):
        f(torch.ones(3), n)


@cell
def int_loop_count():
    def step(x, n):
        for _ in range(n):
            x = x * 2
        return x

    f = torch.compile(step, backend="eager")
    for n in (1, 2, 3, 4):
        f(torch.ones(3), n)


@cell
def float_argument():
    def step(x, lr):
        return x - lr * x

    f = torch.compile(step, backend="eager")
    for lr in (0.1, 0.01, 0.001, 0.0001):
        f(torch.ones(3), lr)


@cell(config={"specialize_float": True})
def float_specialized():
    def step(x, lr):
        return x - lr * x

    f = torch.compile(step, backend="eager")
    for lr in (0.1, 0.01, 0.001):
        f(torch.ones(3), lr)


@cell
def list_length():
    def step(xs):
        return sum(x.sum() for x in xs)

    f = torch.compile(step, backend="eager")
    for n in (1, 2, 3):
        f([torch.ones(2)] * n)


@cell
def shape_and_dtype():
    def step(x, y):
        return x + y

    f = torch.compile(step, backend="eager")
    y = torch.ones(1)
    f(torch.ones(8), y)
    f(torch.ones(16, dtype=torch.float64), y)


@cell
def int_and_shape():
    def step(x, n):
        return x * n

    f = torch.compile(step, backend="eager")
    f(torch.ones(8), 3)
    f(torch.ones(16), 4)


# -- the recompile limit ---------------------------------------------------------------------
@cell(config={"recompile_limit": 2})
def recompile_limit():
    def step(x, n):
        for _ in range(n):
            x = x + 1
        return x

    f = torch.compile(step, backend="eager")
    for n in (1, 2, 3, 4):
        f(torch.ones(2), n)
    f(torch.ones(2), 1)  # the inputs of a cached graph
    f(torch.ones(2), 5)


@cell(config={"recompile_limit": 4})
def recompile_budget():
    def step(x, n):
        for _ in range(n):
            x = x - 1
        return x

    f = torch.compile(step, backend="eager")
    for n in (1, 2, 3, 4):
        f(torch.ones(2), n)


# -- graph breaks ----------------------------------------------------------------------------
def breaks_on_print(x):
    y = x.sin()
    print("step")
    return y.cos()


def log_norm(x):
    print("norm", x.shape)
    return x / x.norm()


@cell
def break_print():
    f = torch.compile(breaks_on_print, backend="eager")
    f(torch.ones(3))


@cell
def break_item_if():
    def step(x):
        if x.sum().item() > 0:
            return x * 2
        return x

    f = torch.compile(step, backend="eager")
    f(torch.ones(3))


@cell
def break_item_arith():
    def step(x):
        v = x.sum().item()
        return x * v

    f = torch.compile(step, backend="eager")
    f(torch.ones(3))


@cell
def break_explicit():
    def step(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    f = torch.compile(step, backend="eager")
    f(torch.ones(3))


@cell
def break_tensor_if():
    def step(x):
        if x.sum() > 0:
            return x * 2
        return x

    f = torch.compile(step, backend="eager")
    f(torch.ones(3))


@cell
def break_helper_two_lines():
    def step(x):
        x = log_norm(x + 1)
        x = log_norm(x * 2)
        return x

    f = torch.compile(step, backend="eager")
    f(torch.ones(3))


@cell
def break_called_many_times():
    f = torch.compile(breaks_on_print, backend="eager")
    for _ in range(5):
        f(torch.ones(3))


@cell
def break_in_loop():
    def step(x):
        for i in range(3):
            x = x + 1
            print(i)
        return x

    f = torch.compile(step, backend="eager")
    for _ in range(3):
        f(torch.ones(3))


@cell
def fullgraph():
    f = torch.compile(breaks_on_print, backend="eager", fullgraph=True)
    f(torch.ones(3))


# -- strict stances --------------------------------------------------------------------------
@cell
def error_on_recompile():
    def step(x):
        return x * 2

    f = torch.compile(step, backend="eager")
    with torch._dynamo.config.patch(error_on_recompile=True):
        f(torch.ones(3))
        f(torch.ones(5))


@cell
def fail_on_recompile():
    def step(x):
        return x * 2

    f = torch.compile(step, backend="eager")
    f(torch.ones(3))
    with torch.compiler.set_stance("fail_on_recompile"):
        f(torch.ones(3))  # cached: runs
        f(torch.ones(5))


# -- modules and nesting ---------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


@cell
def module_compile():
    model = Block()
    model.compile(backend="eager")
    for n in (2, 3, 4):
        model(torch.randn(n, 4))


@cell
def module_compile_builtin():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    model.compile(backend="eager")  # (torch.nn's own forward: Dynamo skips it)
    for n in (2, 3):
        model(torch.randn(n, 4))


@cell
def nested_compiled():
    def inner(x):
        return x.sin()

    g = torch.compile(inner, backend="eager")

    def outer(x):
        return g(x) + 1

    f = torch.compile(outer, backend="eager")
    f(torch.ones(3))
    f(torch.ones(3, dtype=torch.float64))
    g(torch.ones(4))


def run_cell(name: str) -> None:
    """Run cell ``name`` as its user would: under its config."""
    with torch._dynamo.config.patch(**CONFIG[name]):
        CELLS[name]()


# -- what torch says of a run ----------------------------------------------------------------
@dataclass
class Failure:
    """One failing guard torch's verbose recompile log names: the entry and its text."""

    entry: str
    text: str
    stack: list[tuple[str, int]]  # its "User stack trace": (file, line), outermost first


@dataclass
class Logged:
    """One record of torch's own logs, with the compile it was logged in."""

    compile_id: str
    artifact: str  # "recompiles", "graph_breaks", "limit"
    message: str


@dataclass
class Call:
    """One call of a compiled function in a re-run that watches its calls."""

    inputs: dict  # by name: a tensor as (shape, dtype, requires_grad, contiguous), else a value
    grad: bool  # grad mode
    training: tuple  # a module's (and its submodules') training flags; () for a function
    fits: bool  # whether the inputs passed the guards of a cached entry
    compiles: int  # compiles made during the call
    graph_runs: int  # graphs of the counting backend run during the call
    code: str = ""  # the compiled code's name (a module's forward, a function's own)
    raised: bool = False  # an exception left the call


def summary(value):
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return (tuple(value.shape), dtype, value.requires_grad, value.is_contiguous())
    if isinstance(value, (list, tuple)):
        return ("len", len(value))
    return value


@dataclass
class Run:
    """What torch did in one run of a cell."""

    error: BaseException | None
    metrics: list
    logs: list[Logged]
    callers: dict[str, str]  # compile id -> the cell's file:line that was running
    entries: dict[str, list[str]]  # compile id -> the guards of its cache entry (after)
    entry_code: dict[str, str] = field(default_factory=dict)  # compile id -> its code's name
    calls: list[Call] = field(default_factory=list)
    compile_kwargs: list[dict] = field(default_factory=list)

    def compiled(self) -> list:
        """Records of the compiles that made a graph (not failed ones)."""
        return [m for m in self.metrics if not m.fail_type]

    def recompiles(self) -> dict[str, list[Failure]]:
        """Compile id -> the failing guards torch's verbose log named for that recompile."""
        out = {}
        for r in self.logs:
            if r.artifact == "recompiles":
                out[r.compile_id] = failures(r.message)
        return out

    def breaks(self) -> list[Logged]:
        return [r for r in self.logs if r.artifact == "graph_breaks"]

    def limit_hits(self) -> list[Logged]:
        return [r for r in self.logs if r.artifact == "limit"]


_FAILURE = re.compile(r"^\s*- (?P<entry>\d+/\d+): (?P<text>.*)$")
_STACK = re.compile(r'^\s*-\s+File "(?P<file>[^"]+)", line (?P<line>\d+), in ')


def failures(message: str) -> list[Failure]:
    """The failing guards of one "Recompiling function" message (verbose: one per entry)."""
    out: list[Failure] = []
    for line in message.splitlines():
        m = _FAILURE.match(line)
        if m:
            out.append(Failure(m["entry"], m["text"].rstrip(), []))
            continue
        s = _STACK.match(line)
        if s and out:
            out[-1].stack.append((s["file"], int(s["line"])))
    return out


class _Records(logging.Handler):
    """torch._dynamo's log records, each with the compile it was made in."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.logs: list[Logged] = []

    def emit(self, record: logging.LogRecord) -> None:
        name = record.name
        artifact = (
            "recompiles"
            if name.endswith("__recompiles_verbose")
            else "graph_breaks"
            if name.endswith("__graph_breaks")
            else "limit"
            if "hit config." in record.getMessage()
            else None
        )
        if artifact is not None:
            cid = torch._guards.CompileContext.current_compile_id()
            self.logs.append(Logged(str(cid), artifact, record.getMessage()))


def _caller_of(callers: dict[str, str]):
    def on_start(args) -> None:
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename != HERE:
            frame = frame.f_back
        if frame is not None:
            callers[str(args.compile_id)] = f"{HERE}:{frame.f_lineno}"

    return on_start


def _codes() -> list[types.CodeType]:
    """Every code object Dynamo may have compiled in a cell: the functions and methods of
    this module and those nested in them, torch.nn's module wrapper, and the resume
    functions Dynamo generated from any of them."""
    from torch._dynamo import external_utils
    from torch._dynamo.resume_execution import ContinueExecutionCache

    todo = [external_utils.wrap_inline.__code__]
    for obj in list(globals().values()):
        if isinstance(obj, types.FunctionType):
            todo.append(obj.__code__)
        elif isinstance(obj, type) and obj.__module__ == __name__:
            todo += [f.__code__ for f in vars(obj).values() if isinstance(f, types.FunctionType)]
    seen: list = []
    while todo:
        code = todo.pop()
        if code in seen:
            continue
        seen.append(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        if code in ContinueExecutionCache.cache:
            todo += list(ContinueExecutionCache.cache[code].values())
    return seen


def cache_entries() -> tuple[dict[str, list[str]], dict[str, str]]:
    """Compile id -> the guards of each cache entry alive now, one line each; and compile
    id -> the name of the code it is on."""
    out, codes = {}, {}
    for code in _codes():
        for e in _debug_get_cache_entry_list(code):
            lines = str(e.guard_manager).splitlines()
            out[str(e.compile_id)] = [re.sub(r"^[\s|]*\+- ", "", ln) for ln in lines if "+- " in ln]
            codes[str(e.compile_id)] = code.co_name
    return out, codes


def _bound(fn, args, kwargs) -> tuple[dict, list[str]]:
    """A compiled callable's call as its frame's locals, and the names of its positional
    arguments (each also as ``args[i]``, the name torch.nn's own wrapper gives it)."""
    inner = torch._dynamo.eval_frame.innermost_fn(fn)
    module = getattr(fn, "_orig_mod", None) or getattr(inner, "__self__", None)
    target = module.forward if isinstance(module, torch.nn.Module) else inner
    params = list(inspect.signature(target).parameters.values())
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in params if p.kind in kinds][: len(args)]
    named = {**dict(zip(names, args, strict=False)), **kwargs}
    return {**named, **{f"args[{i}]": a for i, a in enumerate(args)}}, names


@dataclass(frozen=True)
class Change:
    """A fix applied to a re-run: ``compile`` updates each torch.compile call's arguments
    (pairs); ``before(inputs)`` changes a call's inputs (its frame's locals, by name) and
    may return a context to run the call in; ``count``: compile with a counting backend;
    ``watch``: record each call (:class:`Call`)."""

    compile: tuple = ()
    before: object = None
    count: bool = False
    watch: bool = False


def _compile_with(change: Change, run: Run):
    graph_runs = [0]

    def counting(gm, example_inputs):
        def go(*args):
            graph_runs[0] += 1
            return gm.forward(*args)

        return go

    def compile(model=None, **kwargs):
        if model is None:  # @torch.compile(...)
            return lambda model: compile(model, **kwargs)
        kwargs = {**kwargs, **dict(change.compile)}
        run.compile_kwargs.append(dict(kwargs))
        if change.count:
            kwargs["backend"] = counting
        compiled = REAL_COMPILE(model, **kwargs)
        if change.before is None and not (change.count or change.watch):
            return compiled
        inner = torch._dynamo.eval_frame.innermost_fn(compiled)
        module = getattr(compiled, "_orig_mod", None) or getattr(inner, "__self__", None)
        code = (module.forward if isinstance(module, torch.nn.Module) else inner).__code__

        def call(*args, **kw):
            if torch.compiler.is_compiling():  # called from a compiled function: traced as is
                return compiled(*args, **kw)
            inputs, names = _bound(compiled, args, kw)
            ctx = change.before(inputs) if change.before else None
            args = tuple(inputs[names[i]] if i < len(names) else a for i, a in enumerate(args))
            before = len(get_compilation_metrics()), graph_runs[0]
            fits = any(e.guard_manager.check(inputs) for e in _debug_get_cache_entry_list(code))
            with ctx or contextlib.nullcontext():
                training = (
                    tuple(m.training for m in module.modules())
                    if isinstance(module, torch.nn.Module)
                    else ()
                )
                seen = {k: summary(v) for k, v in inputs.items()}
                grad = torch.is_grad_enabled()
                raised = True
                try:
                    out = compiled(*args, **kw)
                    raised = False
                finally:
                    made = get_compilation_metrics()[before[0] :]
                    made = len([m for m in made if not m.fail_type])
                    runs = graph_runs[0] - before[1]
                    run.calls.append(
                        Call(seen, grad, training, fits, made, runs, code.co_name, raised)
                    )
            return out

        return call

    return compile


def torch_run(name: str, config: dict | None = None, change: Change | None = None) -> Run:
    """Run cell ``name`` from a fresh Dynamo with torch's logs on; ``config``: a
    ``torch._dynamo.config`` patch over the cell's own; ``change``: a fix applied to it."""
    torch._dynamo.reset()
    clear_compilation_metrics()
    records, callers = _Records(), {}
    run = Run(None, [], records.logs, callers, {})
    logger = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(recompiles_verbose=True, graph_breaks=True)
    logger.addHandler(records)
    on_start = torch._dynamo.callback.callback_handler.register_start_callback(_caller_of(callers))
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch._dynamo.config.patch(**{**CONFIG[name], **(config or {})}))
            torch.compile = _compile_with(change or Change(), run)
            stack.callback(setattr, torch, "compile", REAL_COMPILE)
            CELLS[name]()
    except Exception as exc:  # (what torch raised is part of what it did)
        run.error = exc
    finally:
        torch._dynamo.callback.callback_handler.remove_start_callback(on_start)
        logger.removeHandler(records)
        torch._logging.set_logs()
    run.metrics = get_compilation_metrics()
    run.entries, run.entry_code = cache_entries()
    torch._dynamo.reset()
    return run
