"""A worker group started by torchrun, on one machine or several: every rank runs this.

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST0:29400 \\
        -m gt_core.worker_process --listen 127.0.0.1:7077 --authkey-file FILE

Rank 0 listens for a client (gt_core.worker_process.listen: the same key, hello and refusals as one
remote worker); the others wait for it. For each client every rank starts a worker process,
a rank of a fresh torch.distributed group (gt_core.worker_process.group, as a local group's ranks),
and every rank runs the client's stream: rank 0's worker copies the bytes the client sends to
the others as they arrive (a connection from each, authenticated with the same key) and
relays their events to the client (tagged with their rank, as a local group's are); only rank
0 answers. The ranks meet through torchrun's store: the client's options, where the group's
rendezvous and rank 0's relay listen (``MASTER_ADDR``, where rank 0 runs, on free ports).

A rank whose worker ends during a session ends the session: rank 0's worker exits, so the
client's next wait is the usual one-line error, and the others see their stream end. Each
worker ends with its rank's process (torchrun's), and rank 0's listener serves the next
client with fresh workers, or, after ``--clients N``, tells the others to stop.
"""

from __future__ import annotations

import hashlib
import hmac
import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import threading
import time
from multiprocessing.connection import Client

from gt_core.worker_process.cpu_share import worker_environment

__all__ = ["in_torchrun", "serve_group"]

_POLL_S = 0.1  # how often a waiting rank looks for a client (or the end) in the store
_CONNECT_S = 120.0  # a rank's worker reaches rank 0's relay within this long
_READ = 1 << 20
_DRAIN_S = 10.0  # a drain waits this long at most for the other ranks' events


def in_torchrun() -> bool:
    """Whether this process is a rank of a torchrun with more than one process."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def serve_group(address: tuple[str, int], authkey: bytes, clients=None, say=None) -> None:
    """This rank's part: rank 0 serves clients on ``address``; the others follow."""
    import torch.distributed as dist

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    store, rank, world = next(dist.rendezvous("env://"))
    store = dist.PrefixStore("gt", store)
    if rank != 0:
        return _follow(store, rank, world, authkey, say)
    from gt_core.worker_process.listen import refuse_client, serve_clients

    served = [0]

    def run(conn, events, options, peer, say):
        if options.workers not in (1, world):
            why = f"{world} (the ranks of this remote worker group, started by torchrun), or 1"
            return refuse_client(conn, events, "workers", options.workers, why, peer, say)
        served[0] += 1
        host = os.environ.get("MASTER_ADDR", "127.0.0.1")
        init = f"tcp://{host}:{_free_port(host)}"
        relay = (host, _free_port(host))
        store.set(f"client/{served[0]}", _sign(authkey, (options, init, relay)))
        _run(
            f"rank 0 of {world} serving {peer}",
            _rank0,
            (conn, events, options, _spec(0, world, init), relay, authkey),
            say,
            conn,
            events,
        )

    try:
        serve_clients(address, authkey, say, clients, run)
    finally:
        store.set("stop", b"1")


def _follow(store, rank: int, world: int, authkey: bytes, say) -> None:
    """A rank > 0: a worker for each client rank 0 announces, until it says stop."""
    n = 1
    while True:
        if store.check([f"client/{n}"]):
            options, init, relay = _verified(authkey, store.get(f"client/{n}"))
            args = (options, _spec(rank, world, init), relay, authkey)
            _run(f"rank {rank} of {world}, client {n}", _rank_r, args, say)
            n += 1
        elif store.check(["stop"]):
            return
        else:
            time.sleep(_POLL_S)


def _sign(authkey: bytes, obj) -> bytes:
    """``obj`` pickled, after an HMAC of it with the key: a rank unpickles what rank 0 wrote
    into torchrun's store (which anyone who reaches its port can write) only if it proves
    the key (see _verified)."""
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
    return hmac.new(authkey, data, hashlib.sha256).digest() + data


def _verified(authkey: bytes, signed: bytes):
    mac, data = signed[:32], signed[32:]
    if not hmac.compare_digest(mac, hmac.new(authkey, data, hashlib.sha256).digest()):
        raise RuntimeError(
            "gt remote worker group: a client announced in torchrun's store does not carry "
            "rank 0's key: give every rank the same --authkey-file"
        )
    return pickle.loads(data)


def _spec(rank: int, world: int, init: str):
    from gt_core.worker_process.group import GroupSpec

    return GroupSpec(rank, world, init)


def _run(what: str, target, args, say, *close) -> None:
    """Run ``target(*args)`` in a worker process of its own until it ends."""
    proc = mp.get_context("spawn").Process(target=target, args=args, daemon=True, name="gt-rank")
    with worker_environment():
        proc.start()
    for c in close:
        c.close()
    say(f"gt remote worker group: {what} (worker pid {proc.pid})")
    proc.join()
    say(f"gt remote worker group: {what} done (exit status {proc.exitcode})")


def _free_port(host: str) -> int:
    with socket.create_server((host, 0)) as s:
        return s.getsockname()[1]


# -- the worker processes ------------------------------------------------------------------
def _rank_r(options, spec, relay, authkey) -> None:
    """A rank > 0's worker: its stream and its events through rank 0's relay."""
    from gt_core.worker_process.ending import run_then_end
    from gt_core.worker_process.serve import worker_main

    if not _ends_with_its_rank():
        return
    stream = _connect(relay, authkey, ("stream", spec.rank))
    events = _connect(relay, authkey, ("events", spec.rank))
    run_then_end(worker_main, stream, events, options, inline=True, group=spec)


def _ends_with_its_rank() -> bool:
    """A worker ends with its rank's process, at once (SIGKILL: it may be waiting in a
    collective or a rendezvous, where a SIGTERM's handler would never run; a group's
    workers compile inline, so there is no compile process to end first). Its group meets
    at its own rendezvous, not at torchrun's store. False if its rank has ended already."""
    from gt_core.worker_process.listen import end_with_parent

    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)
    return end_with_parent(signal.SIGKILL)


def _connect(relay, authkey: bytes, hello):
    deadline = time.monotonic() + _CONNECT_S
    while True:
        try:
            conn = Client(relay, authkey=authkey)
            break
        except ConnectionRefusedError:  # (rank 0's worker is not listening yet)
            if time.monotonic() > deadline:
                raise
            time.sleep(_POLL_S)
    conn.send(hello)
    return conn


def _rank0(conn, events, options, spec, relay, authkey) -> None:
    """Rank 0's worker: the client's stream, copied to every rank; their events relayed."""
    from multiprocessing.connection import Connection

    from gt_core.worker_process.ending import end_process
    from gt_core.worker_process.listen import Door
    from gt_core.worker_process.published import drain_others
    from gt_core.worker_process.serve import worker_main

    if not _ends_with_its_rank():
        return
    door = Door(relay, authkey)
    door.sock.settimeout(_CONNECT_S)
    streams, feeds = {}, {}
    while len(streams) + len(feeds) < 2 * (spec.world - 1):
        c = door.accept()
        kind, rank = c.recv()
        (streams if kind == "stream" else feeds)[rank] = c
    door.close()
    mine, tee = socket.socketpair()
    relay = _Relay(conn, tee, streams, feeds, events)
    relay.start()
    drain_others(relay.wait_ranks)
    worker_main(Connection(mine.detach()), events, options, inline=True, group=spec)
    relay.ending = True
    end_process()


class _Relay:
    """Rank 0's copies: the client's bytes to this worker and to every rank (as they come,
    frames untouched), this worker's answers to the client, the ranks' events to it."""

    def __init__(self, client, tee, streams, feeds, events):
        self.client = socket.socket(fileno=os.dup(client.fileno()))
        self.tee = tee
        self.streams, self.feeds, self.events = streams, feeds, events
        self.ranks = [socket.socket(fileno=os.dup(c.fileno())) for _, c in sorted(streams.items())]
        self.ending = False
        # Each rank's answers to the drains (its event batches published by then) and its
        # batches forwarded; the drains rank 0 has served (see wait_ranks).
        self.answered = {r: [] for r in streams}
        self.forwarded = dict.fromkeys(feeds, 0)
        self.asked = 0
        self.changed = threading.Condition()

    def wait_ranks(self, timeout: float = _DRAIN_S) -> None:
        """Once every rank has answered this drain and its batches up to then are
        forwarded (each rank runs the same stream, so it answers the same drain)."""
        self.asked += 1
        k = self.asked

        def done():
            a, f = self.answered, self.forwarded
            return all(len(a[r]) >= k and f.get(r, 0) >= a[r][k - 1] for r in a)

        with self.changed:
            self.changed.wait_for(done, timeout)

    def start(self) -> None:
        threads = [(self._down, ()), (self._up, ())]
        threads += [(self._answers, (r, c)) for r, c in self.streams.items()]
        threads += [(self._events, (r, c)) for r, c in self.feeds.items()]
        for fn, args in threads:
            threading.Thread(target=fn, args=args, name="gt-relay", daemon=True).start()

    def _down(self) -> None:
        """The client's bytes, to this worker and every rank; its end, to them all."""
        try:
            while data := self.client.recv(_READ):
                self.tee.sendall(data)
                for s in self.ranks:
                    s.sendall(data)
        except OSError:
            pass
        self.ending = True
        for s in (self.tee, *self.ranks):
            try:
                s.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _up(self) -> None:
        """This worker's answers, to the client."""
        try:
            while data := self.tee.recv(_READ):
                self.client.sendall(data)
        except OSError:
            pass

    def _answers(self, rank: int, conn) -> None:
        """A rank's answers (to the drains' requests, not the client's to read): noted.
        Its end before the client's ends the session (the client hears this worker end)."""
        try:
            while True:
                _, status, sent = pickle.loads(conn.recv_bytes())
                with self.changed:
                    self.answered[rank].append(sent if status == "ok" else 0)
                    self.changed.notify_all()
        except (EOFError, OSError):
            pass
        if not self.ending:
            from gt_core.observe import events as ev
            from gt_core.worker_process.published import send as forward

            why = f"rank {rank} of the torchrun group ended (its worker's connection closed)"
            try:
                forward(self.events, [ev.event(ev.WORKER, state="died", cause=why, rank=0)])
            except OSError:
                pass
            os._exit(1)

    def _events(self, rank: int, conn) -> None:
        from gt_core.worker_process.published import send as forward

        try:
            while True:
                forward(self.events, conn.recv())
                with self.changed:
                    self.forwarded[rank] += 1
                    self.changed.notify_all()
        except (EOFError, OSError):
            pass
