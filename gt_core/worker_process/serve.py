"""The worker process: its loop reads the client's messages, runs batches through the hot-path
engine, and answers requests (a fetch, a sync op, a control) naming each request's id.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import os
import pickle
import signal
import socket

import torch

from gt_core.hotpath.engine import Engine
from gt_core.observe import events as ev
from gt_core.options import shard_axes
from gt_core.stream import requests as rq
from gt_core.stream import staging
from gt_core.stream.instructions import PUT, RNG, SYNC, Sync, from_wire, import_op_modules
from gt_core.worker_process import published
from gt_core.worker_process.cpu_share import CpuShare
from gt_core.worker_process.executor import Executor
from gt_core.worker_process.group import Group, adjust

__all__ = ["Worker", "worker_main", "serve", "refuse"]


def _device(choice: str = "auto"):
    """The worker's device: the option's, or for "auto" CUDA where present, else the CPU."""
    import torch

    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(choice)


class Worker:
    """The executor and the hot-path engine over it: what a worker (or the in-process one) is.

    Batches go through the engine, which runs their instructions on the executor (as hot
    blocks, or one by one); the executor knows nothing of the engine.
    """

    def __init__(self, options, publish):
        try:
            import torch._inductor.config as ic

            ic.fallback_random = True  # compiled random ops draw from the same generator as eager
        except Exception:
            pass
        self.ex = Executor(_device(options.device), publish)
        self.engine = Engine(self.ex, options, publish)
        self.device = self.ex.device
        self.group = None  # a worker group's rank (gt_core.worker_process.group.Group), if one

    def feed(self, batch) -> None:
        self.engine.feed(batch)

    def barrier(self, kind: str) -> None:
        """A sync point: everything before it has run (its events: see publish_events)."""
        self.engine.feed([Sync(SYNC, kind)])

    def publish_events(self) -> None:
        """Send the events still held back (after a sync's answer: see worker_main)."""
        self.engine.flush_events()

    def close(self) -> None:
        self.engine.close()


def serve(w: Worker, msg):
    """Answer one request ``("req", id, request)`` (gt_core.stream.requests) by its type:
    ("ok", value) or ("err", exception)."""
    req = msg[2]
    handler = _REQUESTS.get(type(req))
    if handler is None:
        return ("err", ValueError(f"gt worker: unknown request {req!r}"))
    w.barrier(req.kind)
    err = w.ex.take_error()
    if err is not None:
        return ("err", err)
    try:
        return ("ok", handler(w, req))
    except Exception as exc:
        return ("err", exc)


def _events_sent(w: Worker, req: rq.EventsSent) -> int:
    published.wait_for_others()  # (a torchrun group's rank 0: the other ranks' events first)
    w.publish_events()  # the count includes every event up to here
    return published.sent()


_REQUESTS = {  # request type -> its answer, once everything sent before it has run
    rq.Fetch: lambda w, req: w.ex.fetch(req.vid),
    rq.Call: lambda w, req: w.ex.call(req.idx, req.args, req.kwargs, req.base),
    rq.Stats: lambda w, req: w.ex.stats(),
    rq.Ping: lambda w, req: (os.getpid(), str(w.ex.device)),
    rq.EventsSent: _events_sent,
    rq.RngState: lambda w, req: torch.get_rng_state(),  # the CPU generator's state
    rq.DefaultDtype: lambda w, req: torch.set_default_dtype(req.dtype),
    rq.SetOptions: lambda w, req: w.engine.control(req),
    rq.WaitCompiles: lambda w, req: w.engine.control(req),
    rq.JitPlan: lambda w, req: w.engine.control(req),
    rq.Forget: lambda w, req: w.engine.control(req),
}

_DOWNLOADS = 4 << 20  # the download area's first size in bytes (it grows for larger values)
_REUSE = 512 << 20  # bytes of uploads' storage kept for the next uploads of the same size


def worker_main(conn, event_conn, options, inline: bool = False, group=None) -> None:
    """The worker process's loop: run batches, answer requests, until told to stop.

    ``inline``: the client is on another machine (gt_core.worker_process.listen): tensor answers
    carry their bytes, as its uploads do, instead of naming a shared-memory segment.
    ``group``: this process is a rank of a worker group (a gt_core.worker_process.group.GroupSpec):
    it runs the same stream as the others; only rank 0 answers.
    """
    tag = {} if group is None else {"rank": group.rank}

    def publish(events):
        published.send(event_conn, [{**e, **tag} for e in events] if tag else events)

    # Ctrl-C in a terminal reaches the whole process group: it is the client's to handle (its
    # wait ends; this process finishes the work and answers). SIGTERM (the client exiting
    # without stop()) ends the loop below, so the compile process and its files go too.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    torch.set_grad_enabled(False)  # autograd runs in the client; the worker sees plain aten ops
    try:
        import_op_modules(options.worker_imports)
    except Exception as exc:  # the answer to the client's first request, then the end
        refuse(conn, exc)
        return
    w = _start(adjust(options) if group is not None else options, publish, group)
    inbox = _Inbox(conn)
    w.engine.cpu_share.recheck_with(inbox.waited)
    uploads = staging.Reader(w.device, reuse=_REUSE)
    downloads = staging.InlineWriter() if inline else staging.Writer(_DOWNLOADS)
    try:
        _loop(w, conn, inbox, uploads, downloads)
    except SystemExit:
        pass
    finally:
        with contextlib.suppress(Exception):  # the client may be gone: nothing to tell
            w.close()
        uploads.close()
        downloads.close()
        if w.group is not None:
            w.group.close()
    try:
        publish([ev.event(ev.WORKER, state="stopped", pid=os.getpid(), device=str(w.device))])
    except Exception:
        pass


def _start(options, publish, group=None) -> Worker:
    """The worker (a worker group's rank: joined to the others), its compile process started
    beside it (and warmed), announced."""
    w = Worker(options, publish)
    if group is not None:
        w.group = Group(group, w.device, publish)
        w.engine.compiler.joined(w.group.agree)
        w.engine.runner.joined(w.group.agree)
        comms = w.group.comms
        w.engine.outbox.stamp_with(lambda: {"comm": comms.snapshot()})
        axes = shard_axes(options)
        if axes:
            from gt_core.worker_process.shard import ShardPolicy

            def replicated(op: str, why: str) -> None:
                w.engine.outbox.emit(ev.SHARDED, op=op, reason=why)

            policy = ShardPolicy(group.world, w.device, axes, replicated)
            w.ex.shard_with(policy)
            w.engine.compiler.shard_with(policy)
    cp = w.engine.compile_process() if options.auto_compile or options.compile_all else None
    if cp is not None:
        cp.start()  # the compile process imports beside this one
        cp.imports()  # before serving, not beside a step: seconds of Python holding the GIL
        w.engine.warm_soon()
    w.engine.build_ahead()  # (a process of its own: a thread here takes no client's time)
    gc.freeze()  # torch's own objects live as long as the worker: full collections skip them
    publish([ev.event(ev.WORKER, state="started", pid=os.getpid(), device=str(w.device))])
    w.engine.cpu_share = CpuShare(w.device, options.worker_threads)
    return w


def _loop(w: Worker, conn, inbox, uploads, downloads) -> None:
    """Run batches and answer requests until the client stops or goes away."""
    share = w.engine.cpu_share
    answers = w.group is None or w.group.rank == 0  # (a group's other ranks run, and say nothing)
    while True:
        try:
            msg = inbox.next()
        except (EOFError, OSError):
            return  # the client went away
        share.set(inbox.waits or msg[0] == "req", w.engine.compiler.compiling > 0)
        if msg[0] == "batch":
            batch = from_wire(msg[1])
            if msg[2]:  # it names staged uploads: copied out now, in stream order
                _unstage(batch, uploads)
            w.feed(batch)
        elif msg[0] == "req":
            if w.group is not None and type(msg[2]) is rq.SetOptions:
                msg = (*msg[:2], rq.SetOptions(adjust(msg[2].options)))
            if type(msg[2]) is rq.SetOptions:
                share.fix(msg[2].options.worker_threads)  # (a capture's own worker_threads)
            status, value = serve(w, msg)
            if not answers and type(msg[2]) is not rq.EventsSent:  # (GroupTransport.drain)
                continue
            if status == "ok" and type(msg[2]) in rq.TENSOR_ANSWERS:
                downloads.rewind()  # the client has read the last answer (or dropped it)
                status, value = _staged(downloads, value)
            _answer(conn, msg[1], status, value)
            # Events go out after the answer, not before it (publishing, a pickle and a
            # write, would add to every .item()'s wait), and only iteration timings may
            # wait (at most a twentieth of a second, as without syncs): a message per
            # sync would wake the client's event thread as its main thread goes on with
            # the next step. wait() and report() drain them all.
            w.engine.outbox.flush_soon()
        elif msg[0] == "mark" and answers:  # everything sent before it has run (post_mark)
            conn.send_bytes(pickle.dumps((msg[1], "ok", None), pickle.HIGHEST_PROTOCOL))
        elif msg[0] == "stop":
            return


def _unstage(batch: list, uploads: staging.Reader) -> None:
    """PUT and RNG instructions get their tensors out of the upload ring (in place)."""
    for i, ins in enumerate(batch):
        if ins.code == PUT:
            batch[i] = ins._replace(value=uploads.take(ins.value))
        elif ins.code == RNG:
            batch[i] = ins._replace(state=uploads.take(ins.state, _CPU))


_CPU = torch.device("cpu")


def _staged(downloads: staging.Writer, value):
    """A tensor answer as its place in the download area ("ok", Staged), or why not."""
    try:
        return "ok", downloads.stage(value)
    except Exception as exc:  # (no room in /dev/shm, say): the client's error, not our end
        return "err", RuntimeError(f"gt worker: could not send the value back: {exc}")


def _answer(conn, rid: int, status: str, value) -> None:
    """Send the answer to request ``rid``, plainly pickled (multiprocessing's pickler copies
    its reducer table per message; tensors travel staged, never pickled)."""
    try:
        conn.send_bytes(pickle.dumps((rid, status, value), pickle.HIGHEST_PROTOCOL))
    except Exception as exc:  # an unpicklable exception or value
        why = RuntimeError(f"{type(value).__name__}: {value}\n{exc}")
        conn.send_bytes(pickle.dumps((rid, "err", why), pickle.HIGHEST_PROTOCOL))


def _exit_on_sigterm(signum, frame):
    raise SystemExit(0)


def refuse(conn, exc: BaseException) -> None:
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
    """The worker's incoming messages, read as soon as they are sent: knows if a request waits.

    Messages are multiprocessing's frames (a 4-byte big-endian length, or -1 and an 8-byte
    one, then a pickle). Where the connection is a socket (a duplex Pipe on POSIX) they are
    read in bulk, every frame that has arrived in one system call, instead of a poll and two
    reads per message: a replayed gt_core.jit call is one message, so the worker's cost per
    message is a part of every replayed call's.
    """

    def __init__(self, conn):
        self.conn = conn
        self.queue: collections.deque = collections.deque()
        # Requests queued: the client is blocked on one's answer, so the worker's runs are not
        # beside the client's recording and take every core. gt_core.jit's replayed calls
        # post marks ahead and block only when too far ahead: a mark says which earlier mark
        # the client then waits for (blocked_on); a mark taken out is answered at once (passed).
        self.requests = 0
        self.blocked_on: int | None = None
        self.passed = -1
        self.buf = bytearray()
        self.sock = _socket_of(conn)

    def next(self):
        if self.sock is None:
            if not self.queue:
                self._take(self.conn.recv())
            while self.conn.poll(0):
                self._take(self.conn.recv())
        else:
            while not self.queue:
                self._read(wait=True)
            self._read(wait=False)  # what arrived since: a request waiting behind
        msg = self.queue.popleft()
        if msg[0] == "req":
            self.requests -= 1
        elif msg[0] == "mark":
            self.passed = msg[1]
        return msg

    @property
    def waits(self) -> bool:
        """Whether the client waits for the worker now (as far as what has arrived says)."""
        return self.requests > 0 or (self.blocked_on is not None and self.passed < self.blocked_on)

    def waited(self) -> bool:
        """Whether the client waits (see waits), once what has arrived since is read."""
        try:
            if self.sock is None:
                while self.conn.poll(0):
                    self._take(self.conn.recv())
            else:
                self._read(wait=False)
        except (EOFError, OSError):
            pass  # the client went away: the loop's next read says so
        return self.waits

    def _read(self, wait: bool) -> None:
        """Queue every whole frame that has arrived (``wait``: block until some bytes do)."""
        try:
            data = self.sock.recv(_READ, 0 if wait else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return
        if not data:
            raise EOFError
        buf = self.buf
        buf += data
        at, end = 0, len(buf)
        while end - at >= 4:
            size, head = int.from_bytes(buf[at : at + 4], "big", signed=True), 4
            if size == -1:  # a frame over 2 GiB: its length follows in 8 bytes
                if end - at < 12:
                    break
                size, head = int.from_bytes(buf[at + 4 : at + 12], "big"), 12
            if end - at < head + size:
                break
            with memoryview(buf) as view:  # (released before the buffer shrinks)
                self._take(pickle.loads(view[at + head : at + head + size]))
            at += head + size
        del buf[:at]

    def _take(self, msg) -> None:
        self.queue.append(msg)
        if msg[0] == "req":
            self.requests += 1
        elif msg[0] == "mark" and msg[2] is not None:
            self.blocked_on = msg[2]


_READ = 1 << 20  # bytes read at once at most


def _socket_of(conn):
    """A socket over ``conn``'s descriptor, for reads that may not block (None: not a socket).

    A duplicate of the descriptor: closing it leaves the connection's open; MSG_DONTWAIT
    makes one read non-blocking without changing the descriptor's flags the sends share.
    """
    try:
        fd = os.dup(conn.fileno())
    except (OSError, AttributeError, ValueError):
        return None
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return None
    if sock.type != socket.SOCK_STREAM:
        sock.close()
        return None
    return sock
