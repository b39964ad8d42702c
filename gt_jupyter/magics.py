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
import sys
import time

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gt_core.observe.status import Status

from . import commands
from .dashboard import SHOW, Dashboard, LiveUpdater
from .options import (
    GT,
    capture_options,
    check_options,
    core_module,
    diagnostics_module,
    parse_flags,
    usage_error,
)

__all__ = ["GTMagics", "GT", "load", "unload"]


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
    @argument("--workers", type=int, metavar="N", help="ranks of a local worker group (SPMD)")
    @argument(
        "--shard",
        action="append",
        metavar="NAME=AXIS",
        help="with --workers: shard the tensors made inside signal NAME along AXIS (DTensor)",
    )
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
        args = parse_flags(self.gt, line)
        options = capture_options(args)
        core = core_module()
        check_options(
            self.gt, core, options
        )  # also with --local: a bad value is a mistake there too
        explained = diagnostics_module().diagnostics(eager_every=core.config()["user_eager_every"])
        run_in = explained if args.local else _both(core.capture(**options), explained)
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
                    raise usage_error(self.gt, exc) from None
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
        """gt commands: status, config, connect, reset, restart, stop, graph, diff, log, dashboard, explain.

        In [1]: %gt status
        In [2]: %gt config threshold=3 backend=aot_eager
        In [3]: %gt diff 3f2a9c0d1e2b 9b1c2d3e4f5a
        """
        return commands.run(self, line)


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
