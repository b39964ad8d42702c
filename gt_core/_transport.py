"""The worker: a spawned process (or, for debugging, this process) that owns the device.

The client talks to it through a :class:`Transport`: batches of instructions go one way
without waiting; a request (fetch a value, run a sync op) waits for one reply. Events come
back on their own channel, read by a thread of the client, so the dashboard sees them live.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import multiprocessing as mp
import os
import pickle
import signal
import statistics
import sys
import threading
import time
import traceback
import types

import torch

from . import events as ev
from ._compile_proc import end_group
from ._instructions import PUT, RNG
from ._interrupt import check as check_interrupt
from ._interrupt import interruptible
from .errors import WorkerDied

__all__ = ["Transport", "ProcessTransport", "InProcessTransport", "worker_main"]

_POLL_S = 0.05


def _device(choice: str = "auto"):
    """The worker's device: the option's, or for "auto" CUDA where present, else the CPU."""
    import torch

    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


def _make_executor(options, publish):

    from ._executor import Executor
    from ._hotpath import Engine

    try:
        import torch._inductor.config as ic

        ic.fallback_random = True  # compiled random ops draw from the same generator as eager
    except Exception:
        pass
    ex = Executor(_device(options.device), publish)
    ex.engine = Engine(ex, options, publish)
    return ex


def _serve(ex, msg):
    """Answer one request ``("req", id, kind, payload)``: ("ok", value) or ("err", exception)."""
    kind, payload = msg[2], msg[3]
    ex.barrier(kind)
    err = ex.take_error()
    if err is not None:
        return ("err", err)
    try:
        if kind == "fetch":
            return ("ok", ex.fetch(payload))
        if kind == "call":
            return ("ok", ex.call(*payload))
        if kind == "stats":
            return ("ok", ex.stats())
        if kind == "ping":
            return ("ok", (os.getpid(), str(ex.device)))
        if kind == "engine":
            return ("ok", ex.engine.control(*payload))
        if kind == "events_sent":
            ex.publish_events()  # the count includes every event up to here
            return ("ok", _sent[0])
        if kind == "rng":  # the CPU generator's state, after everything sent so far ran
            return ("ok", torch.get_rng_state())
        return ("err", ValueError(f"gt worker: unknown request {kind!r}"))
    except Exception as exc:
        return ("err", exc)


_sent = [0]  # event batches this worker process has published (see ProcessTransport.drain)


def worker_main(conn, event_conn, options) -> None:
    """The worker process's loop: run batches, answer requests, until told to stop."""
    lock = threading.Lock()

    def publish(events):
        with lock:
            event_conn.send(events)
            _sent[0] += 1

    # Ctrl-C in a terminal reaches the whole process group: it is the client's to handle (its
    # wait ends; this process finishes the work and answers). SIGTERM (the client exiting
    # without stop()) ends the loop below, so the compile process and its files go too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    from ._instructions import import_op_modules

    torch.set_grad_enabled(False)  # autograd runs in the client; the worker sees plain aten ops
    try:
        import_op_modules(options.worker_imports)
    except Exception as exc:  # the answer to the client's first request, then the end
        _refuse(conn, exc)
        return
    ex = _make_executor(options, publish)
    cp = ex.engine.compile_process() if options.auto_compile or options.compile_all else None
    if cp is not None:
        cp.start()  # the compile process imports beside this one
        cp.imports()  # before serving, not beside a step: seconds of Python holding the GIL
        threading.Thread(target=ex.engine.warm, name="gt-compile-warm", daemon=True).start()
    gc.freeze()  # torch's own objects live as long as the worker: full collections skip them
    publish([ev.event(ev.WORKER, state="started", pid=os.getpid(), device=str(ex.device))])
    share = ex.engine.cpu_share = _CpuShare(ex.device, options.worker_threads)
    inbox = _Inbox(conn)
    try:
        while True:
            try:
                msg = inbox.next()
            except (EOFError, OSError):
                break  # the client went away
            share.set(inbox.requests > 0 or msg[0] == "req", ex.engine.compiling > 0)
            if msg[0] == "batch":
                ex.feed(msg[1])
            elif msg[0] == "req":
                status, value = _serve(ex, msg)
                try:
                    conn.send((msg[1], status, value))  # the request's id: see request()
                except Exception as exc:  # an unpicklable exception or value
                    why = RuntimeError(f"{type(value).__name__}: {value}\n{exc}")
                    conn.send((msg[1], "err", why))
                # The events up to this sync go out after its answer, not before it:
                # publishing (pickling, a write) cost every .item() about 30 µs of waiting.
                # The client's event thread receives them either way; wait() and report()
                # drain them.
                ex.publish_events()
            elif msg[0] == "mark":  # everything sent before it has run (see post_mark)
                conn.send((msg[1], "ok", None))
            elif msg[0] == "stop":
                break
    except SystemExit:
        pass
    finally:
        with contextlib.suppress(Exception):  # the client may be gone: nothing to tell
            ex.engine.close()
    try:
        publish([ev.event(ev.WORKER, state="stopped", pid=os.getpid(), device=str(ex.device))])
    except Exception:
        pass


def _exit_on_sigterm(signum, frame):
    raise SystemExit(0)


def _refuse(conn, exc: BaseException) -> None:
    """Answer the first request with ``exc`` (a worker that could not start)."""
    try:
        while True:
            msg = conn.recv()
            if msg[0] == "req":
                conn.send((msg[1], "err", exc))
                return
    except (EOFError, OSError):
        pass


class _Inbox:
    """The worker's incoming messages, read as soon as they are sent: knows if a request waits."""

    def __init__(self, conn):
        self.conn = conn
        self.queue: collections.deque = collections.deque()
        self.requests = 0  # requests queued: the client is blocked on one

    def next(self):
        if not self.queue:
            self._take(self.conn.recv())
        while self.conn.poll(0):
            self._take(self.conn.recv())
        msg = self.queue.popleft()
        if msg[0] == "req":
            self.requests -= 1
        return msg

    def _take(self, msg) -> None:
        self.queue.append(msg)
        if msg[0] == "req":
            self.requests += 1


class _CpuShare:
    """The worker's intra-op threads on a CPU: every core while the client waits for an answer,
    one fewer while the client records the next steps, one fewer again while a block compiles.

    Two busy processes on too few cores stall each other: OpenMP's barriers spin for threads
    the client's recording has preempted. Measured on 2 cores (benchmarks/overhead.py, MLP
    batch 128, no sync): a compiled step took 3.4 ms on the worker with 2 threads beside the
    client and 1.2 ms with 1. Beside an inductor compile (its process and C++ builds), eager
    runs with 2 threads stalled up to 117 ms; with 1, at most 13 ms (benchmarks/stall.py).

    Whether a compiled block gains from the extra core while the client waits depends on the
    block: the MLP step at batch 128 took 0.73 ms with 2 threads and 1.18 ms with 1, at batch
    8 it took 0.35 ms with 2 and 0.19 ms with 1 (waking the second thread for each of its
    small kernels costs more than it saves, and its spinning afterwards slowed the client's
    recording of the next step). So each block tries both counts a few times and keeps the
    one with the lower median (see choose and learn).
    """

    TRIALS = 5  # runs per thread count before a block's choice is made

    def __init__(self, device, threads: int | None = None):
        import torch

        self.torch = torch
        self.all = torch.get_num_threads()
        self.active = device.type == "cpu" and self.all > 1
        self.now = self.all
        self.waits = False
        self.trials: dict[str, dict[int, list[float]]] = {}  # block -> thread count -> ms
        self.chosen: dict[str, int] = {}
        if threads:  # a fixed count instead (options.worker_threads; benchmarks)
            torch.set_num_threads(threads)
            self.active = False

    def set(self, client_waits: bool, compiling: bool = False) -> None:
        if not self.active:
            return
        self.waits = client_waits
        self._use(max(1, self.all - (not client_waits) - compiling))

    def _use(self, n: int) -> None:
        if n != self.now:
            self.torch.set_num_threads(n)
            self.now = n

    def choose(self, block: str) -> int | None:
        """The thread count for a compiled run of ``block`` now (None: the current one)."""
        if not self.active or not self.waits or self.now < 2:
            return None  # nothing to choose: the client records beside it, or one core
        n = self.chosen.get(block)
        if n is None:
            tried = self.trials.setdefault(block, {self.now: [], self.now - 1: []})
            n = min(tried, key=lambda k: len(tried[k]))  # the count tried least so far
        n = min(n, self.now)
        self._use(n)
        return n

    def learn(self, block: str, n: int | None, ms: float) -> bool:
        """A compiled run of ``block`` with ``n`` threads took ``ms``; False while trying."""
        if n is None or block in self.chosen:
            return True
        tried = self.trials[block]
        tried.setdefault(n, []).append(ms)
        if all(len(v) >= self.TRIALS for v in tried.values()):
            self.chosen[block] = min(tried, key=lambda k: statistics.median(tried[k]))
        return False


@contextlib.contextmanager
def _without_main():
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
    def request(self, kind: str, payload=None): ...
    def alive(self) -> bool: ...
    def stop(self) -> None: ...

    def drain(self, timeout: float = 10.0) -> None:
        """Return once the worker's events so far are in the client's log (here: at once)."""

    def post_mark(self) -> int:
        """Ask, without waiting, to hear when the worker has run everything sent so far."""
        return 0

    def wait_mark(self, mark: int) -> None:
        """Wait until the worker has run everything sent before ``mark`` (see post_mark)."""


def _has_tensors(batch) -> bool:
    for ins in batch:
        if ins[0] == PUT or ins[0] == RNG:
            return True
    return False


def _no_modes():
    """Pickling and unpickling tensors makes tensors: never inside the capture mode."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


@contextlib.contextmanager
def _isolated():
    """Run worker code in the client's process as the worker process would: no capture, no grad."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes

    from ._capture import _in_worker

    was, _in_worker.active = getattr(_in_worker, "active", False), True
    try:
        with _disable_current_modes(), torch.no_grad():
            yield
    finally:
        _in_worker.active = was


class InProcessTransport(Transport):
    """The executor in this process: same code path, no second process (debugging, tests)."""

    def __init__(self, options, on_events):
        from ._instructions import import_op_modules

        self._on_events = on_events
        import_op_modules(options.worker_imports)
        self.ex = _make_executor(options, on_events)
        self.pid, self.device = os.getpid(), str(self.ex.device)
        on_events(
            [ev.event(ev.WORKER, state="started", pid=self.pid, device=self.device, inprocess=True)]
        )
        self._alive = True

    def send(self, batch):
        with _isolated():
            self.ex.feed(batch)

    def request(self, kind, payload=None):
        with _isolated():
            status, value = _serve(self.ex, ("req", 0, kind, payload))
            self.ex.publish_events()
        if kind == "fetch" and status == "ok":
            # The worker's own tensor otherwise: later steps would change a value already
            # fetched (a saved state dict, a model moved to the CPU). A process worker's
            # answer is a copy by crossing the pipe.
            value = value.clone()
        if status == "err":
            raise value
        return value

    def alive(self):
        return self._alive

    def stop(self):
        if self._alive:
            self.ex.engine.close()
        self._alive = False


class ProcessTransport(Transport):
    """A spawned worker process; its death is noticed within one poll interval."""

    stall_s = 5.0  # a wait this long says what the worker is doing (stopped, or busy)
    waiting: str | None = None  # the request being waited for, if one is

    @staticmethod
    def notice(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def __init__(self, options, on_events, start_timeout: float = 120.0):
        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._events_conn, child_events = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(
            target=worker_main, args=(child, child_events, options), daemon=True, name="gt-worker"
        )
        with _without_main():
            self.proc.start()
        child.close()
        child_events.close()
        self.pid = self.proc.pid
        self._on_events = on_events
        self._started = threading.Event()
        self.device = "?"
        self._seen = 0  # event batches received
        self._seen_changed = threading.Condition()
        self._pump = threading.Thread(target=self._read_events, name="gt-events", daemon=True)
        self._pump.start()
        self.cause: str | None = None
        self.compiler: tuple[int, str] | None = None  # the worker's compile process: pid, folder
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._marks: dict[int, bool] = {}  # marks posted and not yet waited for: answered?
        try:
            _, self.device = self.request("ping", timeout=start_timeout)
        except BaseException:  # it could not start (a worker_imports module failed)
            self.stop()
            raise

    def _read_events(self):
        while True:
            try:
                events = self._events_conn.recv()
            except (EOFError, OSError):
                return
            for e in events:
                if e.get("type") == ev.WORKER and e.get("state") == "started":
                    self.device = e.get("device", "?")
                elif e.get("type") == ev.WORKER and e.get("state") == "compiler":
                    self.compiler = (e["pid"], e["dir"])
            self._on_events(events)
            with self._seen_changed:
                self._seen += 1
                self._seen_changed.notify_all()

    def drain(self, timeout: float = 10.0) -> None:
        """Return once every event the worker has published so far is in the client's log."""
        sent = self.request("events_sent")
        with self._seen_changed:
            self._seen_changed.wait_for(lambda: self._seen >= sent, timeout)

    def alive(self) -> bool:
        return self.cause is None and self.proc.is_alive()

    def _end_compiler(self) -> None:
        """The dead worker's compile process (and its C++ builds, its folder) end with it."""
        if self.compiler is not None:
            end_group(*self.compiler)
            self.compiler = None

    def death(self, doing: str) -> WorkerDied:
        self.proc.join(timeout=1.0)
        self._end_compiler()
        code = self.proc.exitcode
        if code is None:
            why = "its connection broke"
        elif code < 0:
            try:
                why = f"it was killed by {signal.Signals(-code).name}"
            except ValueError:
                why = f"it was killed by signal {-code}"
        else:
            why = f"it exited with status {code}"
        if code is not None and -code == signal.SIGKILL:
            why += " (out of memory, or killed from outside)"
        self.cause = why
        self._on_events(
            [ev.event(ev.WORKER, state="died", pid=self.pid, device=self.device, cause=why)]
        )
        return WorkerDied(
            f"gt worker (pid {self.pid}) died: {why}, while {doing}. Its tensors are lost; the "
            "next capture() or %%gt cell starts a fresh worker (or gt_core.worker().restart() "
            "now): re-run the code that creates them."
        )

    def _dead(self) -> WorkerDied:
        return WorkerDied(
            f"gt worker (pid {self.pid}) is dead ({self.cause}); the next capture() or %%gt "
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

    def send(self, batch) -> None:
        if self.cause is not None:
            raise self._dead()
        try:
            # Pickling a tensor makes tensors: never inside the capture's mode. Only uploads
            # carry tensors (the rest are ids and numbers): the mode stays for those batches.
            if _has_tensors(batch):
                with self._lock, _no_modes():
                    self._conn.send(("batch", batch))
            else:  # plain pickle: multiprocessing's pickler copies its reducer table per message
                data = pickle.dumps(("batch", batch), pickle.HIGHEST_PROTOCOL)
                with self._lock:
                    self._conn.send_bytes(data)
        except (BrokenPipeError, EOFError, OSError):
            raise self.death("sending work") from None
        except KeyboardInterrupt:  # outside a capture's held interrupts (see _interrupt)
            raise self._broken("sending work") from None

    def request(self, kind, payload=None, timeout: float | None = None):
        """Send a request and wait for its answer (interruptible: see _wait).

        Requests carry an id and answers name it: the answer to a request whose wait was
        interrupted arrives later and is dropped, never taken as another request's answer.
        """
        if self.cause is not None:
            raise self._dead()
        rid = next(self._ids)
        with self._lock, _no_modes():
            try:
                self._conn.send(("req", rid, kind, payload))
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
        return value

    def post_mark(self) -> int:
        if self.cause is not None:
            raise self._dead()
        rid = next(self._ids)
        self._marks[rid] = False
        try:
            with self._lock:
                self._conn.send(("mark", rid))
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
            if not self.proc.is_alive():
                raise self.death(f"waiting for {kind}")
            waited = time.monotonic() - start
            if timeout is not None and waited > timeout:
                raise WorkerDied(
                    f"gt worker (pid {self.pid}) did not answer {kind} within {timeout:.0f} s"
                )
            # (a start has its own timeout; waiting for compiles is long on purpose)
            if not said and timeout is None and kind != "engine" and waited > self.stall_s:
                said = True
                self.notice(
                    f"gt: still waiting for the worker (pid {self.pid}) after {waited:.0f} s "
                    f"({kind}): {_doing(self.pid)}; press Ctrl-C (interrupt) to stop waiting"
                )

    def kill(self) -> None:
        """End the process now (SIGKILL); its compile process follows it (see _compile_proc)."""
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=2)

    def stop(self) -> None:
        if self.proc.is_alive():
            try:
                with self._lock:
                    self._conn.send(("stop",))
            except Exception:
                pass
            self.proc.join(timeout=5)
            self.kill()
        self._end_compiler()  # gone already after a clean stop; not after a kill
        self.cause = self.cause or "stopped"
        self._conn.close()


def _doing(pid: int) -> str:
    """What a process is doing, in words, from its state in /proc (Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "it is busy with the work sent before"
    if state in ("T", "t"):
        return "it is stopped (SIGSTOP or a debugger); resume it with SIGCONT"
    if state == "D":
        return "it is waiting on the disk or a device"
    return "it is busy with the work sent before"


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
