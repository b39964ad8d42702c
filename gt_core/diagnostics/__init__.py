"""Diagnostics of the user's own ``torch.compile``: compiles, recompiles, limit hits, graph
breaks, cudagraph skips and strict-stance failures, as ``user.*`` events.

Where the information comes from (torch 2.13; each source optional, each private torch API
reached through :mod:`gt_core.diagnostics.torch_hooks`):

- one ``CompilationMetrics`` record per frame compile (``torch._dynamo.utils``): compile id,
  function, timings, op count, the first guard failure that caused a recompile, failures
  (the recompile limit, ``error_on_recompile``), graph-break reasons, cudagraph skip reason.
  We see each record as it is made (Dynamo hands it to ``log_compilation_event``) and read
  the rest from ``get_compilation_metrics()`` on exit;
- Dynamo's log records: the graph-break artifact log (the break's ``file:line``), the
  recompile-limit warning and the cudagraph skip warnings. While diagnostics run, they are
  turned into events and not printed; levels and filters are put back on exit;
- the check Dynamo makes before a recompile (``get_and_maybe_log_recompilation_reasons``):
  its cache entries and the new call's frame. Dynamo's reason names the first failing guard
  of each entry; each entry's guard tree is walked against the call, leaf by leaf, to name
  every failing one (:mod:`.recompile_causes`);
- ``counters["inductor"]["cudagraph_skips"]``: skips that log no reason (CPU);
- the exception leaving the block: ``set_stance("fail_on_recompile")``.

Derived: a ``user.budget`` event once a function has used 75% of
``torch._dynamo.config.recompile_limit`` ("kv_step: 6 of the 8 graphs `recompile_limit`
allows compiled": the limit counts graphs, the first compile's included), before Dynamo
silently runs it eagerly. A source that this torch lacks becomes a ``user.failure``
event naming it; the user's code runs as it would without diagnostics.

Routed cells (``gt_core.capture()``, what ``%%gt`` enters): a ``torch.compile``'d function
called there runs its Python eagerly on the capturing thread, so its aten ops join gt's
instruction stream like any other code, and gt's hot path compiles them with the rest of
the block. Dynamo cannot trace worker tensors (they hold no data; tracing them traces gt's
own recording code), so this is the one way that is both correct and faster. Each such
function gets one ``user.routed`` event per capture saying so. ``%%gt --local`` runs a
cell in the kernel on ordinary tensors, where the user's torch.compile works and is
explained here.
"""

from __future__ import annotations

import contextlib
import sys
import threading

from gt_core.diagnostics import torch_hooks as _hooks
from gt_core.diagnostics.torch_hooks import recompile_limit
from gt_core.diagnostics.watcher import Watcher
from gt_core.observe import events as ev

__all__ = ["diagnostics", "explain", "recompile_limit"]

_state: dict = {"watcher": None, "depth": 0}  # one watcher while any block is open
_lock = threading.Lock()


@contextlib.contextmanager
def diagnostics(log: ev.EventLog | None = None, eager_every: int | None = None):
    """Capture every torch.compile'd function's compiles, recompiles, graph breaks and skips
    inside the block as ``user.*`` events (in ``gt_core.events_log()`` unless ``log``), and
    each call's outcome and time (``user.calls``).

    ``eager_every``: one call in this many of a compiled function runs eagerly, to time the
    compiled calls against (see :mod:`.calls`); 0: none. None: ``GT_USER_EAGER_EVERY``
    (Options.user_eager_every).

    In [1]: with gt_core.diagnostics():
       ...:     for _ in range(12): y = step(x)
    In [2]: gt_core.report().to_data()["user_compiles"]
    """
    if log is None:
        log = ev.kernel_log()
    with _lock:
        _state["depth"] += 1
        watcher = _state["watcher"]
        if watcher is None:  # the outermost block (of any thread) hooks in
            if eager_every is None:
                from gt_core.options import from_env  # noqa: PLC0415 (read when a block opens)

                eager_every = from_env().user_eager_every
            watcher = _state["watcher"] = Watcher(log, eager_every)
            with (
                _hooks.disable_current_modes()
            ):  # inside a capture: torch._dynamo's import unrecorded
                watcher.start()
    try:
        yield watcher.log
    except BaseException as exc:
        with contextlib.suppress(Exception):
            watcher.on_error(exc)
        raise
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                _state["watcher"] = None
                watcher.stop()


def explain(fn_or_name) -> str:
    """One torch.compile'd function's cache entries (one per compile) and their guards, as text."""
    # Not a submodule named explain: importing it would replace this function on the package.
    from gt_core.diagnostics.guards import explain as _explain

    return _explain(fn_or_name, sys._getframe(1))


# gt_core.diagnostics is this function (the module is gt_core.diagnostics in sys.modules):
diagnostics.explain = explain
