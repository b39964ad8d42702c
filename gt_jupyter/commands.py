"""The ``%gt`` line commands, each a function of the GTMagics it runs for and its words.

status, config, connect, reset, restart, stop, graph, diff, log, dashboard, explain; each returns what
the cell shows (a view, a dashboard or text) and fails with a one-line UsageError.

In [1]: %gt status
In [2]: %gt config threshold=3 backend=aot_eager
In [3]: %gt diff 3f2a9c0d1e2b 9b1c2d3e4f5a
In [4]: %gt connect 127.0.0.1:7077 --authkey-file ~/.gt-key
"""

from __future__ import annotations

import os
import shlex

from IPython.core.error import UsageError

from gt_core.observe import events as ev
from gt_core.observe.graph import diff_text

from .dashboard import Dashboard
from .options import config_module, core_module, diagnostics_module
from .views import Text, graph_view, status_view

__all__ = ["USAGE", "run"]

USAGE = (
    "%gt status | config [key=value ...] | connect HOST:PORT [--authkey-file F] | reset | "
    "restart | stop | graph [SIGNATURE] | "
    "diff SIG_A SIG_B | explore [SIGNATURE] | log PATH | dashboard | explain FUNCTION"
)
EXPLAINABLE = "a function or module passed to torch.compile, or its name"


def run(magics, line: str):
    """Run the ``%gt`` command of ``line`` for ``magics``; a mistake is a one-line UsageError."""
    try:
        words = shlex.split(line)
    except ValueError as exc:  # an unclosed quote
        raise UsageError(f"%gt: {exc} in {line!r}: close the quote; usage: {USAGE}") from None
    if not words:
        raise UsageError(f"usage: {USAGE}")
    cmd, rest = words[0], words[1:]
    if cmd not in COMMANDS:
        raise UsageError(f"%gt: unknown command {cmd!r}; usage: {USAGE}")
    return COMMANDS[cmd](magics, rest)


# -- the commands --------------------------------------------------------------------------
def _status(magics, rest):
    _no_args("status", rest)
    core = core_module()
    return status_view(core.report().to_data(), core.worker())


def _config(magics, rest):
    core = core_module()
    if rest:
        updates = {}
        for word in rest:
            key, sep, value = word.partition("=")
            if not sep:
                raise UsageError(f"%gt config: expected key=value, got {word!r}; usage: {USAGE}")
            updates[key.replace("-", "_")] = value
        try:
            core.configure(**_typed(updates))
        except Exception as exc:
            raise UsageError(f"%gt config: {exc}") from None
    values = core.config()
    magics.options.sync(values)
    return Text("gt config\n" + "\n".join(f"  {k} = {v!r}" for k, v in values.items()))


def _connect(magics, rest):
    usage = "%gt connect HOST:PORT [--authkey-file FILE] (or 'process' for a local worker)"
    if len(rest) not in (1, 3) or (len(rest) == 3 and rest[1] != "--authkey-file"):
        raise UsageError(f"%gt connect: expected {usage}, got {' '.join(rest)!r}")
    key_file = os.path.expanduser(rest[2]) if len(rest) == 3 else None
    core = core_module()
    try:
        w = core.connect(rest[0], authkey_file=key_file)
    except (core.GTError, ValueError) as exc:
        raise UsageError(f"%gt connect: {exc}") from None
    magics.options.sync(core.config())
    return Text(f"gt: connected to the worker {core.config()['worker']} (pid {w.pid}, {w.device})")


def _reset(magics, rest):
    _no_args("reset", rest)
    core_module().reset()
    return Text("gt: event history cleared (the worker and its tensors stay)")


def _restart(magics, rest):
    _no_args("restart", rest)
    w = core_module().worker().restart()
    return Text(f"gt: fresh worker pid={w.pid} on {w.device} (tensors of the old one are gone)")


def _stop(magics, rest):
    _no_args("stop", rest)
    core_module().worker().stop()
    return Text("gt: worker stopped (the next %%gt cell starts a fresh one)")


def _graph(magics, rest):
    if len(rest) > 1:
        raise UsageError(f"%gt graph: expected at most one signature, got {len(rest)}")
    data = core_module().report().to_data()
    sig = _find_signature(data, rest[0] if rest else None)
    return graph_view(data, sig)


def _diff(magics, rest):
    if len(rest) != 2:
        raise UsageError(
            f"%gt diff: expected two signatures, got {len(rest)}; usage: %gt diff SIG_A SIG_B"
        )
    data = core_module().report().to_data()
    a, b = (_canonical(data, _find_signature(data, s)) for s in rest)
    return Text(diff_text(a, b))


def _explore(magics, rest):
    if len(rest) > 1:
        raise UsageError(f"%gt explore: expected at most one signature, got {len(rest)}")
    data = core_module().report().to_data()
    if not data["hot_paths"] and not data["user_compiles"]:
        raise UsageError("%gt explore: nothing to explore yet (run a %%gt cell with a loop first)")
    sig = _find_signature(data, rest[0]) if rest else None
    from ._explore import explore  # noqa: PLC0415 (ipywidgets, on first use)

    return explore(sig, data, magics.shell.user_ns)


def _log(magics, rest):
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
    dash = magics.dashboard = Dashboard(summarize(events))
    dash.final = True
    return dash


def _dashboard(magics, rest):
    _no_args("dashboard", rest)
    if magics.dashboard is None:
        raise UsageError("%gt dashboard: no %%gt cell has run yet")
    return magics.dashboard


def _explain(magics, rest):
    if len(rest) != 1:
        raise UsageError(
            f"%gt explain: expected one FUNCTION ({EXPLAINABLE}), got {len(rest)} "
            "arguments; usage: %gt explain FUNCTION"
        )
    name = rest[0]
    try:
        fn = eval(name, magics.shell.user_ns)  # noqa: S307 (a name or attribute the user typed)
    except Exception as exc:
        why = ": ".join([type(exc).__name__, *str(exc).splitlines()[:1]])
        raise UsageError(
            f"%gt explain: expected {EXPLAINABLE}, got {name!r}, which does not evaluate "
            f"here ({why}); define it first (`step = torch.compile(fn)`) or check the spelling"
        ) from None
    if not callable(fn):
        raise UsageError(_not_compiled(name, fn))
    try:
        return Text(diagnostics_module().explain(fn))
    except TypeError as exc:
        if "expected a function or module" not in str(exc):
            raise
        raise UsageError(_not_compiled(name, fn)) from None


# the commands by name, in USAGE's order
COMMANDS = {
    "status": _status,
    "config": _config,
    "connect": _connect,
    "reset": _reset,
    "restart": _restart,
    "stop": _stop,
    "graph": _graph,
    "diff": _diff,
    "explore": _explore,
    "log": _log,
    "dashboard": _dashboard,
    "explain": _explain,
}


# -- what commands return ------------------------------------------------------------------
def _not_compiled(name: str, obj) -> str:
    return (
        f"%gt explain: expected {EXPLAINABLE}, got {name!r}, a {type(obj).__name__}; pass what "
        "torch.compile returned (`step = torch.compile(fn)`, then `%gt explain step`)"
    )


def _typed(updates: dict) -> dict:
    """``key=value`` strings to option values, each read as its option's type (as from GT_*)."""
    config = config_module()
    return {k: config.parse(k, v) for k, v in updates.items()}


def _no_args(cmd: str, rest: list) -> None:
    if rest:
        raise UsageError(f"%gt {cmd}: takes no arguments, got {' '.join(rest)!r}")


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
        if e.get("type") in ev.FORMS and e.get("signature") == sig and e.get("canonical"):
            return e["canonical"]
    raise UsageError(f"%gt diff: the event log has no canonical form for {sig} (was it reset?)")
