"""The public entry points: capture(), the worker handle, report()/reset() (to_worker: moves).

One session (one worker) at a time, started on first use and replaced by restart().
"""

from __future__ import annotations

import atexit
import contextlib
import sys
import threading

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from gt_core.client import collector
from gt_core.client.interrupt import check as check_interrupt
from gt_core.client.interrupt import held
from gt_core.client.patches import (
    patch_capturable,
    patch_default_dtype,
    patch_loader,
    patch_seed,
    patch_sharing,
    patch_threads,
    unpatch_default_dtype,
    unpatch_seed,
    unpatch_threads,
)
from gt_core.client.recording.mode import CaptureMode
from gt_core.client.recording.proxy import Proxy
from gt_core.client.session import Session, set_live_session
from gt_core.client.session_stats import publish_stats
from gt_core.diagnostics.stance import in_worker as _in_worker
from gt_core.diagnostics.stance import routing
from gt_core.errors import CaptureError, ConfigError, WorkerDied
from gt_core.observe import events as ev
from gt_core.observe.report import Report
from gt_core.options import Options, from_env, shard_axes
from gt_core.stream.requests import Forget, SetOptions, Stats, WaitCompiles

__all__ = [
    "capture",
    "worker",
    "report",
    "reset",
    "wait",
    "configure",
    "config",
    "events_log",
    "session",
    "current_session",
]

_lock = threading.RLock()


class _Here(threading.local):
    depth = 0  # captures this thread is inside (nested ones re-enter the outermost)
    session = None  # the outermost one's


_here = _Here()


def current_session():
    """The session of the capture this thread is inside; None outside one (starts nothing)."""
    return _here.session


# "captures": threads inside a capture now; "opt_hook": the optimizer-state hook while one is
_state = {
    "session": None,
    "options": None,
    "captures": 0,
    "opt_hook": None,
}


def events_log() -> ev.EventLog:
    """The client's EventLog (this kernel's events since the last reset, per-step ones folded)."""
    return ev.kernel_log()


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


def session(replace_dead: bool = False):
    """The live session, starting a worker if there is none.

    ``replace_dead``: a session whose worker died is closed and a fresh one started, with one
    line saying so (what capture() does; elsewhere the death is raised where it is met).
    """
    with _lock:
        s = _state["session"]
        if replace_dead and s is not None and not s.closed:
            why = s.lost()
            if why is not None:
                s.close()
                fresh = session()
                print(
                    f"gt: the worker (pid {s.transport.pid}) had died ({why}); started a fresh "
                    f"one (pid {fresh.transport.pid}). Tensors of the old worker are lost: "
                    "re-run the code that creates them.",
                    file=sys.stderr,
                )
                return fresh
        if s is None or s.closed:
            from gt_core.client.session import Session

            opts = _options()
            _apply_log(opts)
            s = _state["session"] = Session(opts, events_log())
        return s


set_live_session(session)  # where recording finds the live session


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
        return session().request(Stats())

    def __repr__(self) -> str:
        s = _state["session"]
        if s is None or s.closed:
            return "<gt worker: not started>"
        t = s.transport
        return f"<gt worker pid={t.pid} device={t.device} alive={t.alive()}>"


_handle = WorkerHandle()
# At the kernel's exit the worker stops as stop() stops it: its compile process and temp
# files go with it (multiprocessing's own exit handler would only terminate it).
atexit.register(_handle.stop)


def worker() -> WorkerHandle:
    """The handle of the worker process (started on first use of pid, device or a tensor)."""
    return _handle


@contextlib.contextmanager
def capture(**options):
    """Run tensor work inside the block on the gt worker; options override the config.

    Captures belong to a thread: inside one, this thread's new tensors live on the worker. A
    capture entered inside another (a %%gt cell that calls capture()) re-enters it; its options,
    if any, must be the active ones. Several threads may capture at once: their ops go to the
    one worker in turn (each op whole), with the options of the first. The kernel's random
    state goes to the worker as the first capture starts and comes back as the last one ends,
    so seeding before or inside gives eager's draws; the end also raises any worker error
    still pending.
    """
    if _here.depth:
        _same_options(options, _here.session.options, "inside another capture")
        _here.depth += 1
        try:
            yield _here.session
        finally:
            _here.depth -= 1
        return
    with _lock:
        opts = _options().replace(**options) if options else _options()
        s = session(replace_dead=True)
        if _other_worker(opts, s.options) and not _state["captures"]:
            s.close()  # (another kind of worker: its tensors are gone, as after a restart)
            s = _state["session"] = Session(opts, events_log())
        if opts != s.options:
            if _state["captures"]:
                _same_options(options, s.options, "while another thread's capture runs")
            # The session first: plans the worker offers in answer (client_match turned on)
            # reach its event thread at once, and are taken only if it already matches.
            s.set_options(opts)
            s.request(SetOptions(opts))
        _apply_log(opts)
        s.mirror.send_default_dtype(torch.get_default_dtype())
        if _state["captures"] == 0:
            _patch(opts)
            s.mirror.send_rng_state(torch.get_rng_state())
        _state["captures"] += 1
        _here.depth, _here.session = 1, s
    ok = False
    try:
        # The user's torch.compile'd functions run eagerly here: their ops join the stream
        # and gt's hot path compiles them (see gt_core.diagnostics). Before CaptureMode: the
        # hook imports torch._dynamo, whose import must not be recorded.
        with held(), routing(_on_routed(), lambda: _in_worker.active), CaptureMode(Proxy):
            yield s
        ok = True
    finally:
        with _lock:
            _here.depth, _here.session = 0, None
            _state["captures"] -= 1
            last = _state["captures"] == 0
            if last:
                _unpatch()
        _end(s, ok and last)
    check_interrupt()  # a Ctrl-C held while gt finished an op, or the capture's end


def _patch(opts) -> None:
    """What the first capture changes in torch while captures run (client.patches)."""
    patch_seed(lambda: _here.session)
    patch_default_dtype(lambda: _here.session)
    patch_capturable(True)
    from gt_core.client.recording.tensor_io import place_optimizer_state

    _state["opt_hook"] = register_optimizer_step_pre_hook(place_optimizer_state)
    patch_sharing(True)
    patch_loader(True, lambda: _here.session)
    if opts.worker != "inprocess":
        patch_threads()
    collector.freeze()


def _unpatch() -> None:
    """The last capture's end: torch as it was."""
    unpatch_seed()
    unpatch_default_dtype()
    unpatch_threads()
    collector.unfreeze()
    patch_sharing(False)
    patch_loader(False)
    patch_capturable(False)
    _state["opt_hook"].remove()
    _state["opt_hook"] = None


def _end(s, sync: bool) -> None:
    """A capture's end: the work goes out; after a clean end of the last capture, a sync
    brings the worker's random state back and raises a worker error still pending."""
    s.end_capture()  # the session's first capture has ended: later recording sites nothing
    if s.closed or s.dead is not None:  # its death was raised where it was met
        return
    if not sync:
        s.mirror.forget_rng_state()
        with contextlib.suppress(Exception):
            s.flush()
        return
    s.flush()
    publish_stats(s)
    torch.set_rng_state(s.mirror.fetch_rng_state())


def _other_worker(a: Options, b: Options) -> bool:
    """Whether ``a`` asks for another worker than ``b`` (sharding is set when ranks start)."""
    return (a.worker, a.workers, shard_axes(a)) != (b.worker, b.workers, shard_axes(b))


def _same_options(options: dict, active, where: str) -> None:
    if options and _options().replace(**options) != active:
        given = ", ".join(f"{k}={v!r}" for k, v in options.items())
        raise CaptureError(
            f"capture({given}) {where} with other options: one worker has one set of options. "
            "Give options to the outermost capture only, or end the other capture first."
        )


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


def wait(compiles: bool = False, timeout: float | None = None) -> None:
    """Wait until the worker has run the work sent so far and its events have arrived.

    ``compiles=True`` also waits (up to ``timeout`` seconds each) for background compiles.
    """
    s = _state["session"]
    if s is None or s.closed:
        return
    s.request(WaitCompiles(timeout if compiles else 0))
    s.transport.drain()


def report(since: int | None = None) -> Report:
    """Everything gt saw since the last reset: hot paths, compiles, timings, events.

    ``since``: a view's start, from ``events_log().mark()`` (what one cell did).
    """
    s = _state["session"]
    if s is not None and not s.closed:
        publish_stats(s)
    if since is None:
        return Report(events_log().snapshot())
    return Report(*events_log().view(since))


def reset() -> None:
    """Forget the event history and the op counts (the worker and its tensors stay).

    The worker's events of what ran before are taken in first, then forgotten with the rest:
    arriving after the clear (the worker publishes runs up to a twentieth of a second late),
    they showed its blocks' runs in the new history without their detection. The blocks the
    worker knows say what they are again at their next run (Forget)."""
    s = _state["session"]
    try:
        if s is not None and not s.closed and s.dead is None:
            with contextlib.suppress(WorkerDied):  # (a dead worker's events are gone anyway)
                s.request(Forget())  # (a sync: an error of the work before it is raised here)
                s.transport.drain()
    finally:
        events_log().clear()
        if s is not None:
            s.said.clear()
            for k in s.counters:
                s.counters[k] = 0
            s.matcher.lines.reset()  # syncs and uploads per line
