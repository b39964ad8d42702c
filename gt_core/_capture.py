"""The public entry points: capture(), the worker handle, to_worker(), report()/reset().

One session (one worker) at a time, started on first use and replaced by restart().
"""

from __future__ import annotations

import contextlib
import threading

import torch

from . import events as ev
from ._instructions import SEED
from ._proxy import CaptureMode, Proxy, upload
from ._stance import routing
from .config import Options, from_env
from .errors import ConfigError
from .report import Report

__all__ = [
    "capture",
    "worker",
    "to_worker",
    "report",
    "reset",
    "wait",
    "configure",
    "config",
    "events_log",
    "session",
]

_lock = threading.RLock()
_in_worker = threading.local()  # set while in-process worker code runs
_in_worker.active = False
_state = {"session": None, "options": None, "log": None, "depth": 0}


def events_log() -> ev.EventLog:
    """The client's EventLog (this kernel's events since the last reset, per-step ones folded)."""
    if _state["log"] is None:
        _state["log"] = ev.EventLog()
    return _state["log"]


def _options() -> Options:
    if _state["options"] is None:
        _state["options"] = from_env()
    return _state["options"]


def config() -> dict:
    """The current options as a dict (what %gt config shows)."""
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(_options()).items() if k != "signals"}


def configure(**options) -> Options:
    """Change the default options of later captures (validated; bad values raise ConfigError)."""
    with _lock:
        opts = _options().replace(**options)
        _apply_log(opts)  # a log path that cannot be opened is refused before it is kept
        _state["options"] = opts
        return opts


def _apply_log(opts: Options) -> None:
    log = events_log()
    if (opts.log or None) != log.path:
        log.close()
        if opts.log:
            try:
                log.open(opts.log)
            except OSError as exc:
                raise ConfigError(
                    "log (GT_INSTRUCTION_LOG)", opts.log, f"a writable file path ({exc.strerror})"
                ) from None


def session():
    """The live session, starting a worker if there is none."""
    with _lock:
        s = _state["session"]
        if s is None or s.closed:
            from ._session import Session

            opts = _options()
            _apply_log(opts)
            s = _state["session"] = Session(opts, events_log())
        return s


class WorkerHandle:
    """The worker as the user sees it: pid, device, alive, restart(), stop()."""

    @property
    def pid(self) -> int:
        return session().transport.pid

    @property
    def device(self) -> str:
        return session().transport.device

    @property
    def alive(self) -> bool:
        s = _state["session"]
        return s is not None and not s.closed and s.transport.alive()

    @property
    def started(self) -> bool:
        s = _state["session"]
        return s is not None and not s.closed

    def restart(self) -> WorkerHandle:
        """Stop this worker (its tensors are lost) and start a fresh one."""
        self.stop()
        session()
        return self

    def stop(self) -> None:
        with _lock:
            s, _state["session"] = _state["session"], None
            if s is not None:
                s.close()

    def stats(self) -> dict:
        """Live values and bytes held by the worker (a sync)."""
        return session().request("stats")

    def __repr__(self) -> str:
        s = _state["session"]
        if s is None or s.closed:
            return "<gt worker: not started>"
        t = s.transport
        return f"<gt worker pid={t.pid} device={t.device} alive={t.alive()}>"


_handle = WorkerHandle()


def worker() -> WorkerHandle:
    """The handle of the worker process (started on first use of pid, device or a tensor)."""
    return _handle


@contextlib.contextmanager
def capture(**options):
    """Run tensor work inside the block on the gt worker; options override the config."""
    with _lock:
        opts = _options().replace(**options) if options else _options()
        s = session()
        if opts != s.options:
            # The session first: plans the worker offers in answer (client_match turned on)
            # reach its event thread at once, and are taken only if it already matches.
            s.set_options(opts)
            s.request("engine", ("options", opts))
        _apply_log(opts)
        _state["depth"] += 1
    seed = torch.manual_seed
    thread = threading.get_ident()

    def manual_seed(n):
        # Only the user's code seeds the worker: not other threads, not worker code that
        # runs in this process (the in-process worker's compiler seeds its own things).
        if threading.get_ident() == thread and not _in_worker.active:
            s.emit((SEED, int(n)))
        return seed(n)

    torch.manual_seed = torch.random.manual_seed = manual_seed
    try:
        # The user's torch.compile'd functions run eagerly here: their ops join the stream
        # and gt's hot path compiles them (see gt_core.diagnostics). Before CaptureMode: the
        # hook imports torch._dynamo, whose import must not be recorded.
        with routing(_on_routed(), lambda: _in_worker.active), CaptureMode():
            yield s
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                torch.manual_seed = torch.random.manual_seed = seed
        if not s.closed:
            try:
                s.flush()
            except Exception:
                pass
            s.publish_stats()


def _on_routed():
    """One user.routed event per compiled function and capture."""
    seen: set[str] = set()

    def on_routed(name: str) -> None:
        if name not in seen:
            seen.add(name)
            events_log().emit(
                ev.USER_ROUTED,
                function=name,
                message=f"torch.compile({name}) was called with worker tensors: Dynamo does not "
                "trace them; its ops ran through gt's hot path instead",
            )

    return on_routed


def to_worker(obj):
    """Move a tensor, an nn.Module (in place) or an optimizer's state to the worker."""
    s = session()
    if isinstance(obj, Proxy):
        return obj
    if isinstance(obj, torch.Tensor):
        p = upload(s, obj, cache=False)
        if obj.requires_grad:
            p = p.detach().requires_grad_(True)
        return (
            torch.nn.Parameter(p, requires_grad=obj.requires_grad)
            if isinstance(obj, torch.nn.Parameter)
            else p
        )
    if isinstance(obj, torch.nn.Module):
        for t in [*obj.parameters(), *obj.buffers()]:
            if not isinstance(t, Proxy):
                new = to_worker(t)
                torch.utils.swap_tensors(t, new)
        return obj
    if isinstance(obj, torch.optim.Optimizer):
        for state in obj.state.values():
            for k, v in list(state.items()):
                if isinstance(v, torch.Tensor) and not isinstance(v, Proxy):
                    state[k] = to_worker(v)
        return obj
    raise TypeError(
        f"gt_core.to_worker: expected a Tensor, nn.Module or Optimizer, got {type(obj).__name__}"
    )


def wait(compiles: bool = False, timeout: float | None = None) -> None:
    """Wait until the worker has run the work sent so far and its events have arrived.

    ``compiles=True`` also waits (up to ``timeout`` seconds each) for background compiles.
    """
    s = _state["session"]
    if s is None or s.closed:
        return
    s.request("engine", ("wait", timeout if compiles else 0))
    s.transport.drain()


def report(since: int | None = None) -> Report:
    """Everything gt saw since the last reset: hot paths, compiles, timings, events.

    ``since``: a view's start, from ``events_log().mark()`` (what one cell did).
    """
    s = _state["session"]
    if s is not None and not s.closed:
        s.publish_stats()
    if since is None:
        return Report(events_log().snapshot())
    return Report(*events_log().view(since))


def reset() -> None:
    """Forget the event history and the op counts (the worker and its tensors stay)."""
    events_log().clear()
    s = _state["session"]
    if s is not None:
        for k in s.counters:
            s.counters[k] = 0
