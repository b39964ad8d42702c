"""The worker: a spawned process (or, for debugging, this process) that owns the device.

The client talks to it through a :class:`Transport`: batches of instructions go one way
without waiting; a request (fetch a value, run a sync op) waits for one reply. Events come
back on their own channel, read by a thread of the client, so the dashboard sees them live.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing as mp
import pickle
import sys
import threading
import time
import types

import torch

from gt_core.client.interrupt import check as check_interrupt
from gt_core.client.interrupt import interruptible
from gt_core.client.transports.exits import doing as _doing
from gt_core.client.transports.exits import exit_reason as _exit_reason
from gt_core.errors import WorkerDied
from gt_core.observe import events as ev
from gt_core.stream import staging
from gt_core.stream.instructions import PUT, RNG, to_wire
from gt_core.stream.requests import EventsSent, Ping
from gt_core.worker_process.cleanup import end_compile_process

__all__ = ["Transport", "Connected", "ProcessTransport"]

_POLL_S = 0.05
_RING = 16 << 20  # the upload ring's first size in bytes (it grows for larger tensors)
_REUSE = 256 << 20  # bytes of fetched values' storage kept for the next fetches of the same size
_PROTOCOL = pickle.HIGHEST_PROTOCOL  # what goes without tensors is pickled plainly (see send)


@contextlib.contextmanager
def without_main():
    # spawn re-imports the parent's __main__ in the child; the worker needs none of it, and
    # a script without an `if __name__ == "__main__"` guard would run twice.
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class Transport:
    """What the client needs of a worker: send a batch, make a request, know if it lives."""

    pid: int
    device: str
    cause: str | None = None  # why it can no longer run work (None while it can)

    def send(self, batch: list) -> None: ...
    def request(self, req): ...  # a request of gt_core.stream.requests
    def alive(self) -> bool: ...
    def stop(self) -> None: ...

    def stage(self, t: torch.Tensor):
        """What a PUT carries for the plain tensor ``t``: a copy taken now, as the worker will
        get it (the user may change ``t`` before the PUT is sent)."""
        return t.clone()

    copy_ms = 0.0  # the client's ms copying the last fetched value out (see Session.fetch)
    room_ms = 0.0  # the client's ms waiting for the worker to read a full upload ring, in all

    before_wait = staticmethod(lambda: None)

    def before_waiting(self, flush) -> None:
        """``flush()`` runs before each wait for the worker to read every upload: the
        session's flush sends the pending batch, so the uploads waited for are on their way."""
        self.before_wait = flush

    def drain(self, timeout: float = 10.0) -> None:
        """Return once the worker's events so far are in the client's log (here: at once)."""

    def post_mark(self, then_waits_for: int | None = None) -> int:  # noqa: ARG002
        """Ask, without waiting, to hear when the worker has run everything sent so far.
        ``then_waits_for``: the earlier mark the client waits for right after posting this
        one; until the worker has passed it, its runs are not beside the client's work."""
        return 0

    def wait_mark(self, mark: int) -> None:
        """Wait until the worker has run everything sent before ``mark`` (see post_mark)."""


def _has_staged(batch) -> bool:
    for ins in batch:
        if ins.code == PUT or ins.code == RNG:
            return True
    return False


def no_modes():
    """Pickling and unpickling tensors makes tensors: never inside the capture mode."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


class Connected(Transport):
    """A worker behind two connections (requests, events); its death is noticed within one
    poll interval. Subclasses open them (``_open``) and say how the worker lives and ends:
    ``name``, ``_running``, ``_ended``, ``_doing``, ``_join``, ``kill``."""

    stall_s = 5.0  # a wait this long says what the worker is doing (stopped, or busy)
    waiting: str | None = None  # the request being waited for, if one is

    @staticmethod
    def notice(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    local = False  # True: the worker runs on this machine (its pid, compile process are ours)

    def __init__(self, options, on_events, start_timeout: float = 120.0):
        self._on_events = on_events
        self.device = "?"
        self.cause: str | None = None
        self.compiler: tuple[int, str] | None = None  # the worker's compile process: pid, folder
        self._conn, self._events_conn = self._open(options)
        self._seen = 0  # event batches received
        self._seen_changed = threading.Condition()
        self._pump = threading.Thread(target=self._read_events, name="gt-events", daemon=True)
        self._pump.start()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._marks: dict[int, bool] = {}  # marks posted and not yet waited for: answered?
        self._up: staging.Writer | None = None  # uploads, made at the first (see stage)
        self._down = staging.Reader("cpu", reuse=_REUSE)  # fetched values
        staging.sweep()  # segments of gt processes that were killed before cleaning up
        try:
            pid, self.device = self.request(Ping(), timeout=start_timeout)
        except BaseException:  # it could not start (a worker_imports module failed)
            self.stop()
            raise
        self.pid = pid if self.pid is None else self.pid

    def _read_events(self):
        while True:
            try:
                events = self._events_conn.recv()
            except (EOFError, OSError):
                return
            for e in events:
                if e.get("type") == ev.WORKER and e.get("state") == "started":
                    self.device = e.get("device", "?")
                elif e.get("type") == ev.WORKER and e.get("state") == "compiler" and self.local:
                    self.compiler = (e["pid"], e["dir"])
            self._on_events(events)
            with self._seen_changed:
                self._seen += 1
                self._seen_changed.notify_all()

    def drain(self, timeout: float = 10.0) -> None:
        """Return once every event the worker has published so far is in the client's log."""
        sent = self.request(EventsSent())
        with self._seen_changed:
            self._seen_changed.wait_for(lambda: self._seen >= sent, timeout)

    def alive(self) -> bool:
        return self.cause is None and self._running()

    def _end_compiler(self) -> None:
        """The dead worker's compile process ends with it (a local worker's: see below)."""

    def death(self, doing: str) -> WorkerDied:
        why = self._ended()
        self._end_compiler()
        self.cause = why
        self._on_events(
            [ev.event(ev.WORKER, state="died", pid=self.pid, device=self.device, cause=why)]
        )
        return WorkerDied(
            f"{self.name} died: {why}, while {doing}. Its tensors are lost; the "
            "next capture() or %%gt cell starts a fresh worker (or gt_core.worker().restart() "
            "now): re-run the code that creates them."
        )

    def _dead(self) -> WorkerDied:
        return WorkerDied(
            f"{self.name} is dead ({self.cause}); the next capture() or %%gt "
            "cell starts a fresh one (or call gt_core.worker().restart())"
        )

    def _broken(self, doing: str) -> WorkerDied:
        """Interrupted in the middle of a message: the pipe's state is unknown, never reused."""
        self.cause = f"interrupted while {doing}, the connection's state is unknown"
        self._on_events(
            [ev.event(ev.WORKER, state="died", pid=self.pid, device=self.device, cause=self.cause)]
        )
        self.kill()
        return self._dead()

    def stage(self, t: torch.Tensor) -> staging.Staged:
        """``t`` copied into the upload ring; the PUT carries where (see gt_core.stream.staging)."""
        if self.cause is not None:
            raise self._dead()
        if self._up is None:
            self._up = staging.Writer(_RING, make_room=self._room)
        # (the tensors a ring's growth makes stay plain: the guard costs a tenth of no_modes,
        # and a flat tensor's copy makes none)
        with torch._C._DisableTorchDispatch():
            return self._up.stage(t)

    def _room(self) -> None:
        """The ring is full: send what is pending and wait until the worker has read it all."""
        t0 = time.perf_counter()
        self.before_wait()
        self.wait_mark(self.post_mark())  # (an interrupted wait counts no time: it raises)
        self.room_ms += (time.perf_counter() - t0) * 1e3

    def send(self, batch) -> None:
        if self.cause is not None:
            raise self._dead()
        try:
            # Plain pickle (multiprocessing's pickler copies its reducer table per message);
            # tensors never travel pickled: uploads are staged (see stage). The flag tells the
            # worker whether the batch names staged bytes, so that others cost no scan there.
            msg = ("batch", to_wire(batch), _has_staged(batch))
            with self._lock:
                self._conn.send_bytes(pickle.dumps(msg, _PROTOCOL))
        except (BrokenPipeError, EOFError, OSError):
            raise self.death("sending work") from None
        except KeyboardInterrupt:  # outside a capture's held interrupts (see _interrupt)
            raise self._broken("sending work") from None

    def request(self, req, timeout: float | None = None):
        """Send a request and wait for its answer (interruptible: see _wait).

        Requests carry an id and answers name it: the answer to a request whose wait was
        interrupted arrives later and is dropped, never taken as another request's answer.
        """
        if self.cause is not None:
            raise self._dead()
        rid, kind = next(self._ids), req.kind
        self.last_rid = rid
        with self._lock, no_modes():
            try:
                self._conn.send_bytes(pickle.dumps(("req", rid, req), _PROTOCOL))
            except (BrokenPipeError, EOFError, OSError):
                raise self.death(f"sending {kind}") from None
            except KeyboardInterrupt:
                raise self._broken(f"sending {kind}") from None
            while True:
                self._wait(kind, timeout)
                try:
                    got, status, value = self._conn.recv()
                except (BrokenPipeError, EOFError, ConnectionResetError):
                    raise self.death(f"waiting for {kind}") from None
                except KeyboardInterrupt:
                    raise self._broken(f"reading the answer to {kind}") from None
                if got == rid:
                    break
                if got in self._marks:  # a mark's answer read on the way: kept for wait_mark
                    self._marks[got] = True
        if status == "err":
            raise value
        if type(value) in staging.STAGED:  # a fetched value (or the generator's state)
            t0 = time.perf_counter()
            with no_modes():
                value = self._down.take(value)
            self.copy_ms = (time.perf_counter() - t0) * 1e3
        return value

    def post_mark(self, then_waits_for: int | None = None) -> int:
        if self.cause is not None:
            raise self._dead()
        rid = next(self._ids)
        self._marks[rid] = False
        try:
            with self._lock:
                self._conn.send_bytes(pickle.dumps(("mark", rid, then_waits_for), _PROTOCOL))
        except (BrokenPipeError, EOFError, OSError):
            raise self.death("sending work") from None
        except KeyboardInterrupt:
            raise self._broken("sending work") from None
        return rid

    def wait_mark(self, mark: int) -> None:
        with self._lock:
            while not self._marks.get(mark, True):
                self._wait("a mark", None)
                try:
                    got, _, _ = self._conn.recv()
                except (BrokenPipeError, EOFError, ConnectionResetError):
                    raise self.death("waiting for the work sent to run") from None
                except KeyboardInterrupt:
                    raise self._broken("reading the worker's answer") from None
                if got in self._marks:
                    self._marks[got] = True
            self._marks.pop(mark, None)

    def _wait(self, kind: str, timeout: float | None) -> None:
        """Until an answer is readable; says once if the worker seems stalled (see stall_s)."""
        self.waiting = kind
        try:
            self._poll(kind, timeout)
        finally:
            self.waiting = None

    @interruptible
    def _poll(self, kind: str, timeout: float | None) -> None:
        start = time.monotonic()
        said = False
        check_interrupt()  # one held while the request went out ends the wait before it starts
        while not self._conn.poll(_POLL_S):
            if not self._running():
                raise self.death(f"waiting for {kind}")
            waited = time.monotonic() - start
            if timeout is not None and waited > timeout:
                raise WorkerDied(f"{self.name} did not answer {kind} within {timeout:.0f} s")
            # (a start has its own timeout; waiting for compiles is long on purpose)
            if not said and timeout is None and kind != "engine" and waited > self.stall_s:
                said = True
                self.notice(
                    f"gt: still waiting for the {self.name[3:]} after {waited:.0f} s "
                    f"({kind}): {self._doing()}; press Ctrl-C (interrupt) to stop waiting"
                )

    def stop(self) -> None:
        if self._running():
            try:
                with self._lock:
                    self._conn.send(("stop",))
            except Exception:
                pass
            self._join()
        if self._pump is not threading.current_thread():  # (its events end with the worker)
            self._pump.join(timeout=1.0)
        self._end_compiler()  # gone already after a clean stop; not after a kill
        self.cause = self.cause or "stopped"
        self._conn.close()
        if self._up is not None:
            self._up.close()  # (and what the worker never read: its names too)
        self._down.close()


class ProcessTransport(Connected):
    """A spawned worker process on this machine."""

    local = True

    def _open(self, options):
        """Start the worker process: (requests' connection, events' connection)."""
        ctx = mp.get_context("spawn")
        conn, child = ctx.Pipe()
        events_conn, child_events = ctx.Pipe(duplex=False)
        from gt_core.worker_process.cpu_share import worker_environment
        from gt_core.worker_process.ending import run_then_end
        from gt_core.worker_process.serve import worker_main

        self.proc = ctx.Process(
            target=run_then_end,
            args=(worker_main, child, child_events, options),
            daemon=True,
            name="gt-worker",
        )
        with without_main(), worker_environment():
            self.proc.start()
        child.close()
        child_events.close()
        self.pid = self.proc.pid
        return conn, events_conn

    @property
    def name(self) -> str:
        return f"gt worker (pid {self.pid})"

    def _running(self) -> bool:
        return self.proc.is_alive()

    def _ended(self) -> str:
        """Why the worker ended, in words (after waiting a moment for its exit status)."""
        self.proc.join(timeout=1.0)
        return _exit_reason(self.proc.exitcode)

    def _end_compiler(self) -> None:
        """The dead worker's compile process (and its C++ builds, its folder) end with it."""
        if self.compiler is not None:
            end_compile_process(*self.compiler)
            self.compiler = None

    def _join(self) -> None:
        """After a stop was sent: wait for the worker to end, then make sure it has."""
        self.proc.join(timeout=5)
        self.kill()

    def _doing(self) -> str:
        return _doing(self.pid)

    def kill(self) -> None:
        """End the process now (SIGKILL); its compile process follows it (gt_core.compile.process watches its parent)."""
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2)
