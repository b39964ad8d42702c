"""``%%gt`` (run a cell through the gt worker, with a live dashboard) and ``%gt`` commands.

In [1]: %load_ext gt_jupyter
In [2]: %%gt --threshold 3
   ...: for _ in range(20):
   ...:     loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
In [3]: %gt status
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib
import os
import shlex
import sys
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from traitlets import TraitError, TraitType
from traitlets.config import Config, Configurable

from gt_core.observe import events as ev
from gt_core.observe.status import Status

from .dashboard import SHOW, Dashboard, LiveUpdater
from .views import Text, graph_view, status_view

__all__ = ["GTMagics", "GT", "load", "unload"]

COMMANDS = (
    "status",
    "config",
    "reset",
    "restart",
    "stop",
    "graph",
    "diff",
    "log",
    "dashboard",
    "explain",
)
USAGE = (
    "%gt status | config [key=value ...] | reset | restart | stop | graph [SIGNATURE] | "
    "diff SIG_A SIG_B | log PATH | dashboard | explain FUNCTION"
)
EXPLAINABLE = "a function or module passed to torch.compile, or its name"


def _core():
    """gt_core, imported on first use (it imports torch)."""
    return importlib.import_module("gt_core")


def _diagnostics():
    """The diagnostics module (not the function of the same name exported by gt_core)."""
    return importlib.import_module("gt_core.diagnostics")


def _config_module():
    """gt_core.config, the module (``gt_core.config`` itself is the function showing options)."""
    return importlib.import_module("gt_core.config")


class Option(TraitType):
    """One of gt's options: accepts exactly what gt_core's Options accepts for it.

    The check is gt_core's own (gt_core.config.check), made when a value is set: importing
    gt_core imports torch, which loading the extension does not.
    """

    def __init__(self, default, help: str, option: str | None = None):
        super().__init__(default, help=help)
        self.tag(config=True, option=option)  # option: the Options field, where the name differs

    def validate(self, obj, value):
        config = _config_module()
        try:
            config.check(self.metadata["option"] or self.name, value)
        except config.ConfigError as exc:
            raise TraitError(f"GT.{self.name}: {exc}") from None
        return os.fspath(value) if isinstance(value, os.PathLike) else value


class GT(Configurable):
    """gt's options, also settable with ``%config GT.threshold = 3`` (same as ``%gt config``).

    One trait per field of gt_core.Options, with its default (tests/test_config.py checks
    that they match); ``config`` is ``GT.config_file``, since a Configurable's ``config`` is
    its traitlets Config.
    """

    # -- when blocks compile
    auto_compile = Option(True, "compile hot paths (GT_AUTO_COMPILE)")
    compile_all = Option(False, "compile every block on first sight (GT_COMPILE)")
    threshold = Option(5, "repeats before a block is hot (GT_HOTPATH_THRESHOLD)")
    min_seq = Option(8, "fewest instructions in a hot block (GT_HOTPATH_MIN_SEQ)")
    window = Option(8192, "instructions searched for a repeat (GT_HOTPATH_WINDOW)")
    config_file = Option(None, "YAML of named signals (GT_CONFIG)", option="config")
    # -- how they compile
    backend = Option("inductor", "torch.compile backend (GT_BACKEND)")
    mode = Option(None, "torch.compile mode (GT_COMPILE_MODE)")
    dynamic = Option(False, "compile with dynamic shapes (GT_DYNAMIC)")
    background = Option(True, "compile off the critical path (GT_BACKGROUND_COMPILE)")
    compile_process = Option(
        True, "inductor compiles in a process of their own (GT_COMPILE_PROCESS)"
    )
    regression_samples = Option(5, "compiled runs timed before a revert (GT_REGRESSION_SAMPLES)")
    # -- the worker
    worker = Option("process", "process or inprocess: where tensors live (GT_WORKER)")
    device = Option("auto", "the worker's device: auto, cpu, cuda, cuda:N (GT_DEVICE)")
    worker_threads = Option(None, "the worker's CPU threads, fixed (GT_WORKER_THREADS)")
    client_match = Option(True, "a hot block goes out as one message (GT_CLIENT_MATCH)")
    flush_at = Option(512, "instructions batched before they are sent (GT_FLUSH_AT)")
    worker_imports = Option((), "modules the worker imports at start (GT_WORKER_IMPORTS)")
    # -- what gt tells
    debug = Option(0, "0, 1 or 2: a line per detection, compile, fallback (GT_DEBUG_COMPILE)")
    log = Option(None, "events as JSON lines (GT_INSTRUCTION_LOG)")

    def __init__(self, parent=None, **kw):
        # IPython keeps every `%config GT.x = v` in the shell's config, refused ones too, and
        # hands it to each new GT (a reload): it is applied to gt here, through gt's own check,
        # all at once; a bad value is one warning and never a failed %load_ext.
        given = dict(parent.config["GT"]) if parent is not None and "GT" in parent.config else {}
        super().__init__(parent=parent, config=Config(), **kw)
        self._syncing = False
        self.observe(self._changed, names=self.option_names())
        if given:
            traits = self.option_traits()
            try:
                _core().configure(**{traits.get(k, k): v for k, v in given.items()})
            except Exception as exc:
                print(f"gt: IPython's config for GT is not applied: {exc}", file=sys.stderr)
            self.sync(_core().config())

    @classmethod
    def option_traits(cls) -> dict[str, str]:
        """Trait name -> the Options field it sets."""
        traits = cls.class_traits(config=True)
        return {
            n: t.metadata.get("option") or n for n, t in traits.items() if "option" in t.metadata
        }

    @classmethod
    def option_names(cls) -> list[str]:
        return list(cls.option_traits())

    def _changed(self, change) -> None:
        if self._syncing:
            return
        option = self.option_traits()[change["name"]]
        try:
            _core().configure(**{option: change["new"]})
        except Exception as exc:
            self._syncing = True
            try:
                setattr(self, change["name"], change["old"])
            finally:
                self._syncing = False
            raise UsageError(f"GT.{change['name']}: {exc}") from None

    def sync(self, values: dict) -> None:
        """Show gt's current options (without re-applying them)."""
        self._syncing = True
        try:
            for trait, option in self.option_traits().items():
                if option in values:
                    setattr(self, trait, values[option])
        finally:
            self._syncing = False


@magics_class
class GTMagics(Magics):
    """The ``%%gt`` cell magic and the ``%gt`` line magic."""

    def __init__(self, shell):
        super().__init__(shell)
        self.dashboard: Dashboard | None = None  # the last cell's
        self._follower: _Follower | None = None
        self.options = GT(parent=shell)

    # -- %%gt ------------------------------------------------------------------------------
    @magic_arguments()
    @argument(
        "--no-compile", action="store_true", help="record and run on the worker, compile nothing"
    )
    @argument("--compile", action="store_true", help="compile every block on first sight")
    @argument("--threshold", type=int, metavar="N", help="repeats before a block is hot")
    @argument("--min-seq", type=int, metavar="N", help="fewest instructions in a hot block")
    @argument(
        "--backend", metavar="NAME", help="torch.compile backend (inductor, aot_eager, eager)"
    )
    @argument("--mode", metavar="NAME", help="torch.compile mode (e.g. reduce-overhead)")
    @argument("--dynamic", action="store_true", help="compile with dynamic shapes")
    @argument(
        "--show", choices=SHOW, default="all", help="dashboard: all (default), status tables, none"
    )
    @argument("--log", metavar="PATH", help="append every event to PATH as JSON lines")
    @argument(
        "--local",
        action="store_true",
        help="run in the kernel on ordinary tensors; only explain the cell's own torch.compile calls",
    )
    @cell_magic
    def gt(self, line: str, cell: str):
        """Run the cell through gt: tensors on the worker, hot paths compiled, a live dashboard.

        In [1]: %%gt --threshold 3 --backend aot_eager
           ...: for _ in range(20):
           ...:     loss = model(x).sum(); loss.backward(); opt.step(); opt.zero_grad()
        """
        __tracebackhide__ = True  # noqa: F841 (IPython hides this frame in tracebacks)
        args = _parse(self.gt, line)
        options = _options(args)
        core = _core()
        _check(self.gt, core, options)  # also with --local: a bad value is a mistake there too
        if args.local:
            run_in = _diagnostics().diagnostics()
        else:
            run_in = _both(core.capture(**options), _diagnostics().diagnostics())
        code, last = _compile(self.shell, cell)
        log = core.events_log()
        start = log.mark()
        if self._follower is not None:  # the previous cell's dashboard stops following
            self._follower.stop()
        dash = self.dashboard = Dashboard(show=args.show)
        _safely(dash.display, display_id=_cell_id(self.shell, cell))
        live = LiveUpdater(dash, lambda: _cell_data(core, start), count=lambda: len(log))
        if dash.live:
            live.start()
        try:
            with contextlib.ExitStack() as stack:
                try:
                    stack.enter_context(run_in)
                except (core.ConfigError, core.CaptureError) as exc:  # before the cell ran
                    raise _usage_error(self.gt, exc) from None
                exec(code, self.shell.user_ns)  # noqa: S102 (running the user's cell is the point)
                value = eval(last, self.shell.user_ns) if last is not None else None  # noqa: S307
            # (leaving the capture raised any worker error still pending, with its line)
        finally:
            # After a cell that raised: the worker finishes what was sent; an error of its own
            # is logged (the dashboard's reasons show it), the cell's exception is the one shown.
            with contextlib.suppress(Exception):
                core.wait()
            data = live.stop() or _cell_data(core, start)
            if dash.live and _compiling(data):
                # A compile the cell started is still running: keep the view live until it ends.
                self._follower = _Follower(
                    dash, lambda: _cell_data(core, start), count=lambda: len(log)
                )
                self._follower.start()
            else:
                _safely(dash.finalize, data)
            if live.error is not None:
                _warn(live.error)
        return value

    def settle(self, result=None) -> None:
        """After every cell: a dashboard still following a compile is finalized once it ends."""
        if self._follower is not None and self._follower.settle():
            self._follower = None

    # -- %gt -------------------------------------------------------------------------------
    @line_magic("gt")
    def gt_line(self, line: str):
        """gt commands: status, config, reset, restart, stop, graph, diff, log, dashboard, explain.

        In [1]: %gt status
        In [2]: %gt config threshold=3 backend=aot_eager
        In [3]: %gt diff 3f2a9c0d1e2b 9b1c2d3e4f5a
        """
        try:
            words = shlex.split(line)
        except ValueError as exc:  # an unclosed quote
            raise UsageError(f"%gt: {exc} in {line!r}: close the quote; usage: {USAGE}") from None
        if not words:
            raise UsageError(f"usage: {USAGE}")
        cmd, rest = words[0], words[1:]
        if cmd not in COMMANDS:
            raise UsageError(f"%gt: unknown command {cmd!r}; usage: {USAGE}")
        return getattr(self, f"_cmd_{cmd}")(rest)

    def _cmd_status(self, rest):
        _no_args("status", rest)
        core = _core()
        return status_view(core.report().to_data(), core.worker())

    def _cmd_config(self, rest):
        core = _core()
        if rest:
            updates = {}
            for word in rest:
                key, sep, value = word.partition("=")
                if not sep:
                    raise UsageError(
                        f"%gt config: expected key=value, got {word!r}; usage: {USAGE}"
                    )
                updates[key.replace("-", "_")] = value
            try:
                core.configure(**_typed(updates))
            except Exception as exc:
                raise UsageError(f"%gt config: {exc}") from None
        values = core.config()
        self.options.sync(values)
        return Text("gt config\n" + "\n".join(f"  {k} = {v!r}" for k, v in values.items()))

    def _cmd_reset(self, rest):
        _no_args("reset", rest)
        _core().reset()
        return Text("gt: event history cleared (the worker and its tensors stay)")

    def _cmd_restart(self, rest):
        _no_args("restart", rest)
        w = _core().worker().restart()
        return Text(f"gt: fresh worker pid={w.pid} on {w.device} (tensors of the old one are gone)")

    def _cmd_stop(self, rest):
        _no_args("stop", rest)
        _core().worker().stop()
        return Text("gt: worker stopped (the next %%gt cell starts a fresh one)")

    def _cmd_graph(self, rest):
        if len(rest) > 1:
            raise UsageError(f"%gt graph: expected at most one signature, got {len(rest)}")
        data = _core().report().to_data()
        sig = _find_signature(data, rest[0] if rest else None)
        return graph_view(data, sig)

    def _cmd_diff(self, rest):
        if len(rest) != 2:
            raise UsageError(
                f"%gt diff: expected two signatures, got {len(rest)}; usage: %gt diff SIG_A SIG_B"
            )
        data = _core().report().to_data()
        a, b = (_canonical(data, _find_signature(data, s)) for s in rest)
        from gt_core.stream.canonical import diff_text  # noqa: PLC0415

        return Text(diff_text(a, b))

    def _cmd_log(self, rest):
        if len(rest) != 1:
            raise UsageError("%gt log: expected one PATH (an instruction log written with --log)")
        from gt_core.observe.events import load_log  # noqa: PLC0415
        from gt_core.observe.report import summarize  # noqa: PLC0415

        try:
            events = load_log(rest[0])
        except OSError as exc:
            raise UsageError(f"%gt log: cannot read {rest[0]!r}: {exc.strerror or exc}") from None
        except ValueError as exc:  # a line that is not an event: load_log names it
            raise UsageError(f"%gt log: {exc} (write one with `%%gt --log PATH`)") from None
        dash = self.dashboard = Dashboard(summarize(events))
        dash.final = True
        return dash

    def _cmd_dashboard(self, rest):
        _no_args("dashboard", rest)
        if self.dashboard is None:
            raise UsageError("%gt dashboard: no %%gt cell has run yet")
        return self.dashboard

    def _cmd_explain(self, rest):
        if len(rest) != 1:
            raise UsageError(
                f"%gt explain: expected one FUNCTION ({EXPLAINABLE}), got {len(rest)} "
                "arguments; usage: %gt explain FUNCTION"
            )
        name = rest[0]
        try:
            fn = eval(name, self.shell.user_ns)  # noqa: S307 (a name or attribute the user typed)
        except Exception as exc:
            why = ": ".join([type(exc).__name__, *str(exc).splitlines()[:1]])
            raise UsageError(
                f"%gt explain: expected {EXPLAINABLE}, got {name!r}, which does not evaluate "
                f"here ({why}); define it first (`step = torch.compile(fn)`) or check the spelling"
            ) from None
        if not callable(fn):
            raise UsageError(_not_compiled(name, fn))
        try:
            return Text(_diagnostics().explain(fn))
        except TypeError as exc:
            if "expected a function or module" not in str(exc):
                raise
            raise UsageError(_not_compiled(name, fn)) from None


# -- what commands return ------------------------------------------------------------------
def _not_compiled(name: str, obj) -> str:
    return (
        f"%gt explain: expected {EXPLAINABLE}, got {name!r}, a {type(obj).__name__}; pass what "
        "torch.compile returned (`step = torch.compile(fn)`, then `%gt explain step`)"
    )


# -- parsing -------------------------------------------------------------------------------
def _usage(magic) -> str:
    """``usage: %%gt [--no-compile] ...`` on one line.

    IPython writes the usage for the docstring (``::`` and ``%gt``, the line magic's name).
    """
    words = magic.parser.format_usage().split()
    prog = f"%{magic.parser.prog}"
    options = words[words.index(prog) + 1 :] if prog in words else words
    return " ".join(["usage:", f"%%{magic.parser.prog}", *options])


def _usage_error(magic, exc: BaseException | str) -> UsageError:
    """A one-line UsageError: what was wrong, then the usage."""
    text = " ".join(str(exc).split()).rstrip(".")
    return UsageError(f"%%gt: {text}. {_usage(magic)}")


def _parse(magic, line: str):
    """Parse ``%%gt`` options; a mistake is a one-line UsageError carrying the usage."""
    try:
        return parse_argstring(magic, line)
    except UsageError as exc:
        raise _usage_error(magic, exc) from None
    except ValueError as exc:  # shlex: an unclosed quote
        raise _usage_error(magic, f"{exc} in {line!r}: close the quote") from None


def _options(args) -> dict:
    """The capture() options the parsed flags ask for (only those given)."""
    o: dict = {}
    if args.no_compile:
        o["auto_compile"] = False
    if args.compile:
        o["compile_all"] = True
    for flag, key in (
        ("threshold", "threshold"),
        ("min_seq", "min_seq"),
        ("backend", "backend"),
        ("mode", "mode"),
    ):
        if getattr(args, flag) is not None:
            o[key] = getattr(args, flag)
    if args.dynamic:
        o["dynamic"] = True
    if args.log:
        o["log"] = args.log
    return o


def _check(magic, core, options: dict) -> None:
    """Validate the options before the cell runs (a bad value never runs the cell)."""
    try:
        core.Options(**core.config()).replace(**options)
    except (core.ConfigError, ValueError, TypeError) as exc:
        raise _usage_error(magic, exc) from None
    # An unopenable --log path is refused by the capture itself (a ConfigError on entering
    # it, turned into this UsageError before the cell runs).


def _typed(updates: dict) -> dict:
    """``key=value`` strings to option values, each read as its option's type (as from GT_*)."""
    config = _config_module()
    return {k: config.parse(k, v) for k, v in updates.items()}


def _no_args(cmd: str, rest: list) -> None:
    if rest:
        raise UsageError(f"%gt {cmd}: takes no arguments, got {' '.join(rest)!r}")


# -- running a cell ------------------------------------------------------------------------
def _compile(shell, cell: str):
    """The cell as code objects: its body, and its last expression (shown as the cell's value)."""
    source = shell.transform_cell(cell)
    name = shell.compile.cache(source, shell.execution_count)  # tracebacks show the cell's lines
    tree = ast.parse(source, filename=name)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = compile(ast.Expression(tree.body.pop().value), name, "eval")
    return compile(tree, name, "exec"), last


@contextlib.contextmanager
def _both(*managers):
    with contextlib.ExitStack() as stack:
        for m in managers:
            stack.enter_context(m)
        yield


def _safely(fn, *args, **kwargs) -> None:
    """Run a dashboard step; a failure there never breaks the user's cell, and is reported."""
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        _warn(exc)


def _warn(exc: BaseException) -> None:
    print(
        f"gt: the dashboard failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
        "the cell's work is unaffected, `%gt status` shows gt's state",
        file=sys.stderr,
    )


def _compiling(data: dict) -> bool:
    return any(p["status"] == Status.COMPILING for p in data["hot_paths"])


class _Follower(LiveUpdater):
    """After the cell: redraw until no compile of the cell is in flight, then finalize."""

    LIMIT_S = 900.0

    def _run(self) -> None:
        deadline = time.monotonic() + self.LIMIT_S
        while not self._stop.wait(self.interval) and time.monotonic() < deadline:
            self.poll()
            if self.data is not None and not _compiling(self.data):
                break
        self.poll(force=True)
        _safely(self.dashboard.finalize, self.data)

    def stop(self):
        """Stop following; the thread finalizes the dashboard with the latest data."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.data

    def settle(self) -> bool:
        """Finalize now if the compile is over (after each cell); True when it has ended."""
        if self._thread is None or not self._thread.is_alive():
            return True
        self.poll(force=True)
        if self.data is not None and not _compiling(self.data):
            self.stop()
            return True
        return False


def _cell_data(core, start: int) -> dict:
    return core.report(since=start).to_data()


def _cell_id(shell, cell: str) -> str:
    """A display id stable across re-runs of one cell, so its dashboard is replaced."""
    header = getattr(getattr(shell, "kernel", None), "get_parent", lambda *a: None)("shell")
    cell_id = ((header or {}).get("metadata") or {}).get("cellId")
    key = cell_id or cell
    return "gt-" + hashlib.sha1(key.encode()).hexdigest()[:16]


# -- signatures ----------------------------------------------------------------------------
def _find_signature(data: dict, prefix: str | None) -> str:
    sigs = [p["signature"] for p in data["hot_paths"]]
    if not sigs:
        raise UsageError("%gt: no hot path yet (run a %%gt cell with a loop first)")
    if prefix is None:
        from ._tables import primary  # noqa: PLC0415

        return primary(data)
    hits = [s for s in sigs if s.startswith(prefix)]
    if len(hits) != 1:
        what = "no" if not hits else "several"
        raise UsageError(
            f"%gt: {what} hot path signature matches {prefix!r}; known: {', '.join(sigs)}"
        )
    return hits[0]


def _canonical(data: dict, sig: str) -> dict:
    for e in reversed(data["events"]):
        if e.get("type") == ev.DETECTED and e.get("signature") == sig and e.get("canonical"):
            return e["canonical"]
    raise UsageError(f"%gt diff: the event log has no canonical form for {sig} (was it reset?)")


# -- the extension -------------------------------------------------------------------------
_loaded: dict = {}


def load(ip) -> None:
    """Register the magics and ``%config GT`` (a second load is harmless)."""
    if ip in _loaded:
        return
    magics = GTMagics(ip)
    ip.register_magics(magics)
    ip.configurables.append(magics.options)
    ip.events.register("post_run_cell", magics.settle)
    _loaded[ip] = magics


def unload(ip) -> None:
    """Remove the magics and ``%config GT``; stop the worker if one runs."""
    magics = _loaded.pop(ip, None)
    if magics is None:
        return
    for kind in ("line", "cell"):
        ip.magics_manager.magics[kind].pop("gt", None)
    with contextlib.suppress(ValueError):
        ip.configurables.remove(magics.options)
        ip.events.unregister("post_run_cell", magics.settle)
    if magics._follower is not None:
        magics._follower.stop()
    import sys  # noqa: PLC0415

    core = sys.modules.get("gt_core")
    if core is not None:
        core.worker().stop()
