"""A worker on another machine (or this one) behind a TCP connection with an authkey.

The same transport as the local worker's (requests by id, marks, an events connection read
by a thread) over two authenticated ``multiprocessing.connection`` sockets instead of two
pipes. What differs: tensors travel inside the messages (a shared-memory segment cannot be
mapped on another machine, see gt_core.stream.staging.Inline), and the worker's pid, exit
status and compile process are the remote machine's, never acted on here.
"""

from __future__ import annotations

import os
import socket
import time
from multiprocessing.connection import AuthenticationError, Client

from gt_core.client.transports.rank_lines import RankLines
from gt_core.client.transports.transport import Connected, no_modes
from gt_core.errors import RemoteRefused
from gt_core.observe import events as ev
from gt_core.options import remote_address
from gt_core.stream import staging
from gt_core.worker_process.listen import PROTOCOL, nodelay, read_authkey

__all__ = ["InlineStaging", "RemoteTransport", "set_authkey", "authkey_for"]

_KEYS: dict[str, bytes] = {}  # worker option (tcp://HOST:PORT) -> the key connect() was given
_START_S = 30.0  # to hear the listener's answer to the hello


def set_authkey(worker: str, key: bytes | str) -> None:
    """Remember ``key`` for the remote worker ``worker`` (kept in this process only)."""
    _KEYS[worker] = key.encode() if isinstance(key, str) else bytes(key)


def authkey_for(worker: str, authkey_file: str | None) -> bytes:
    """The key for ``worker``: the one connect() was given, else the option's file."""
    if worker in _KEYS:
        return _KEYS[worker]
    if authkey_file is None:
        raise RemoteRefused(
            f"gt: the remote worker {worker} needs its authkey: gt_core.connect("
            f"'{worker[6:]}', authkey=...), or authkey_file= / GT_AUTHKEY_FILE naming the file "
            "its --authkey-file names"
        )
    try:
        return read_authkey(authkey_file)
    except (OSError, ValueError) as exc:
        raise RemoteRefused(f"gt: cannot read the authkey for {worker}: {exc}") from None


class InlineStaging:
    """A transport whose tensors travel inside its messages (a PUT carries the bytes): no
    memory is shared with the worker, which is on another machine, or is each of a group's
    ranks reading the same message."""

    def stage(self, t):
        if self.cause is not None:
            raise self._dead()
        with no_modes():
            return staging.inline(t)


class RemoteTransport(RankLines, InlineStaging, Connected):
    """The worker behind ``tcp://HOST:PORT`` (see gt_core.worker_process.listen), or the rank 0 of a
    worker group started by torchrun (gt_core.worker_process.torchrun), which relays the other
    ranks' events: a batch tagged with a rank feeds that rank's line, and only rank 0's
    reach the session's log, as with a local group."""

    local = False

    def __init__(self, options, on_events, start_timeout: float = 120.0):
        self._init_ranks()
        super().__init__(options, self._split(on_events), start_timeout)

    def _split(self, on_events):
        def split(events):
            for e in events:  # (a torchrun group's rank 0 says which rank ended, then ends)
                if e.get("type") == ev.WORKER and e.get("state") == "died" and "cause" in e:
                    self._cause = e["cause"]
            rank = events[0].get("rank") if events else None  # (a batch is one rank's)
            if rank is not None:
                self._see(rank, events)
            if not rank:
                on_events(events)

        return split

    def _open(self, options):
        self.address = options.worker
        self.pid = None  # (the ping's answer)
        host, port = remote_address(options.worker)
        key = authkey_for(options.worker, options.authkey_file)
        conn = self._connect(host, port, key)
        try:
            nodelay(conn)
            conn.send(("hello", PROTOCOL, options))
            if not conn.poll(_START_S):
                raise RemoteRefused(f"gt: {self.name} did not answer within {_START_S:.0f} s")
            answer = conn.recv()
            if answer[0] != "token":
                raise RemoteRefused(f"gt: {answer[1]}")
            events = self._connect(host, port, key)
            events.send(("events", answer[1]))
        except (OSError, EOFError) as exc:
            conn.close()
            why = f"gt: {self.name} closed the connection as it started: {exc}"
            raise RemoteRefused(why) from None
        self._peek = socket.socket(fileno=os.dup(conn.fileno()))
        return conn, events

    def _connect(self, host: str, port: int, key: bytes):
        try:
            family = "AF_INET6" if ":" in host else "AF_INET"
            return Client((host, port), family=family, authkey=key)
        except AuthenticationError:
            raise RemoteRefused(
                f"gt: the remote worker at {host}:{port} refused this client's authkey; give "
                "the key its --authkey-file holds (gt_core.connect(..., authkey=...) or "
                "GT_AUTHKEY_FILE)"
            ) from None
        except OSError as exc:
            raise RemoteRefused(
                f"gt: cannot reach the remote worker at {host}:{port} "
                f"({exc.strerror or exc}): start it there with `python -m gt_core.worker_process "
                f"--listen {host}:{port} --authkey-file FILE`, or connect to another "
                "(gt_core.connect), or GT_WORKER=process for a local worker"
            ) from None

    @property
    def name(self) -> str:
        pid = f"pid {self.pid} " if self.pid is not None else ""
        return f"gt remote worker ({pid}at {self.address[6:]})"

    def _running(self) -> bool:
        """Whether the connection is open (a peek: end of file means the worker ended)."""
        if self._conn.closed:
            return False
        try:
            return self._peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except BlockingIOError:
            return True
        except OSError:
            return False

    _cause = None  # why the worker said it ends, if it did

    def _ended(self) -> str:
        self._pump.join(timeout=1.0)  # (its last events, read until the connection closed)
        why = "its connection closed (the remote worker ended, or the network failed)"
        return why if self._cause is None else f"{why}: {self._cause}"

    def _doing(self) -> str:
        return "it is busy with the work sent before, or the network is slow"

    def _join(self) -> None:
        deadline = time.monotonic() + 5.0
        try:
            while self._conn.poll(max(0.0, deadline - time.monotonic())):
                self._conn.recv_bytes()  # (answers of marks nobody waits for)
        except (EOFError, OSError):
            pass
        self.kill()

    def kill(self) -> None:
        """Close the connections (the worker there ends when it reads their end)."""
        self._conn.close()
        self._peek.close()
