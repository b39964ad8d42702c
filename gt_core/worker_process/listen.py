"""The remote worker: ``python -m gt_core.worker_process --listen HOST:PORT --authkey-file FILE``.

A listener that serves one client at a time, each with a fresh worker process running the
local worker's loop (gt_core.worker_process.serve.worker_main): the same instruction stream, hot
paths, compiles and events. A client opens two connections, requests and events, as the
local worker has two pipes.

Nothing a client sends is unpickled before it has proved it holds the key: each connection
first runs multiprocessing's HMAC challenge on raw bytes (both ways; what ``Listener.accept``
does), within a few seconds, so a client that connects and says nothing never holds the door.
A client that fails it is refused with one line and nothing runs. The listener binds where it
is told; give a loopback address (the default host) unless the network is trusted, since the
key guards the door, not the traffic (it is not encrypted: tunnel it through ssh across hosts).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import signal
import socket
import struct
import sys
from multiprocessing.connection import (
    AuthenticationError,
    Connection,
    answer_challenge,
    deliver_challenge,
)

from gt_core.worker_process.cpu_share import worker_environment

__all__ = [
    "PROTOCOL",
    "parse_address",
    "read_authkey",
    "serve_clients",
    "nodelay",
    "end_with_parent",
    "Door",
    "refuse_client",
]

PROTOCOL = 1  # the hello's version: a client of another version is refused by name
DEFAULT_HOST = "127.0.0.1"
_HELLO_S = 30.0  # an authenticated client says hello, and opens its events, within this
_HANDSHAKE_S = 5  # a connection proves the key within this many seconds, or is dropped


def parse_address(text: str, default_host: str = DEFAULT_HOST) -> tuple[str, int]:
    """``HOST:PORT``, ``tcp://HOST:PORT`` or ``PORT`` as (host, port); ValueError if not."""
    rest = text[len("tcp://") :] if text.startswith("tcp://") else text
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]") if sep else default_host
    if not port.isdigit() or not 0 <= int(port) < 65536 or (sep and not host):
        raise ValueError(
            f"expected HOST:PORT (e.g. 127.0.0.1:7077), got {text!r}: a host name or address, "
            "a colon and a port number 0-65535"
        )
    return host, int(port)


def read_authkey(path: str) -> bytes:
    """The key in ``path`` (its bytes, surrounding whitespace removed); ValueError if none."""
    with open(path, "rb") as f:
        key = f.read().strip()
    if not key:
        raise ValueError(f"the authkey file {path!r} is empty: write a long random key into it")
    return key


def nodelay(conn) -> None:
    """Small messages go at once (a request is one; Nagle would hold it for an ack)."""
    try:
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


def serve_clients(
    address: tuple[str, int], authkey: bytes, say=None, clients=None, run=None
) -> None:
    """Serve one client at a time on ``address`` (``clients``: how many, None: forever).
    ``run(conn, events, options, peer, say)`` runs an authenticated client's worker until it
    ends (None: one worker process; a torchrun group's rank 0: see gt_core.worker_process.torchrun)."""
    run = run or _one_worker
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    listener = Door(address, authkey)
    host, port = listener.address
    print(f"gt remote worker: listening on {host}:{port}", flush=True)  # (port 0: the one got)
    served = 0
    try:
        while clients is None or served < clients:
            conn = _accept(listener, say)
            if conn is not None:
                served += _serve(listener, conn, say, run)
    finally:
        listener.close()


class Door:
    """A TCP listener whose connections are authenticated, each within _HANDSHAKE_S."""

    def __init__(self, address: tuple[str, int], authkey: bytes):
        self.authkey = authkey
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.sock = socket.create_server(address, family=family, backlog=4)
        self.address = self.sock.getsockname()[:2]
        self.last_accepted = None

    def accept(self) -> Connection:
        sock, self.last_accepted = self.sock.accept()
        _read_timeout(sock, _HANDSHAKE_S)
        conn = Connection(sock.detach())
        try:
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
        except BaseException:
            conn.close()
            raise
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            _read_timeout(s, 0)  # (authenticated: reads wait as long as the client is idle)
        return conn

    def close(self) -> None:
        self.sock.close()


def _read_timeout(sock, seconds: int) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", seconds, 0))


def _accept(listener, say):
    """The next authenticated connection (None: one was refused, said in one line)."""
    try:
        return listener.accept()
    except AuthenticationError as exc:
        say(f"gt remote worker: refused {_peer(listener)}: wrong authkey ({exc}); nothing ran")
    except (OSError, EOFError) as exc:
        say(f"gt remote worker: dropped {_peer(listener)} during authentication: {exc}")
    return None


def _peer(listener) -> str:
    addr = listener.last_accepted
    return f"{addr[0]}:{addr[1]}" if addr else "a client"


def _serve(listener, conn, say, run) -> int:
    """Run one client's worker until it ends; 1 if it ran, 0 if the client was refused."""
    met = _handshake(listener, conn, say)
    if met is None:
        return 0
    nodelay(conn)
    run(conn, *met, _peer(listener), say)
    return 1


def _one_worker(conn, events, options, peer: str, say) -> None:
    """The client's worker: a process of its own, until it ends."""
    if options.workers > 1:
        why = (
            "1: this remote worker is one process; start a group there with torchrun "
            "(torchrun --nproc-per-node N -m gt_core.worker_process --listen ...)"
        )
        return refuse_client(conn, events, "workers", options.workers, why, peer, say)
    ctx = mp.get_context("spawn")
    proc = ctx.Process(
        target=_worker, args=(conn, events, options), daemon=True, name="gt-remote-worker"
    )
    with worker_environment():
        proc.start()
    conn.close()
    events.close()
    say(f"gt remote worker: serving {peer} (worker pid {proc.pid})")
    proc.join()
    say(f"gt remote worker: {peer} done (worker pid {proc.pid}, exit status {proc.exitcode})")


def refuse_client(conn, events, name: str, value, accepted: str, peer: str, say) -> None:
    """Answer the client's first request with a ConfigError (its option ``name`` is
    ``value``, not ``accepted``); nothing runs."""
    from gt_core.errors import ConfigError
    from gt_core.worker_process.serve import refuse

    exc = ConfigError(name, value, accepted)
    say(f"gt remote worker: refused {peer}: {exc}")
    events.close()
    refuse(conn, exc)
    conn.close()


def _handshake(listener, conn, say):
    """An authenticated client's hello and its events connection: (events, its options), or
    None if it was refused or dropped (said in one line)."""
    peer = _peer(listener)
    events = None
    try:
        hello = conn.recv() if conn.poll(_HELLO_S) else None  # (authenticated: may unpickle)
        if not (isinstance(hello, tuple) and len(hello) == 3 and hello[0] == "hello"):
            return _refuse(conn, say, peer, f"expected a gt client's hello, got {_kind(hello)}")
        if hello[1] != PROTOCOL:
            why = f"client protocol {hello[1]}, this worker speaks {PROTOCOL}: use one gt version"
            return _refuse(conn, say, peer, why)
        token = os.urandom(16)
        conn.send(("token", token))
        events = listener.accept()  # the same client's second connection (it proves the token)
        if not (events.poll(_HELLO_S) and events.recv() == ("events", token)):
            events.close()
            return _refuse(conn, say, peer, "its events connection did not follow")
    except (OSError, EOFError, AuthenticationError) as exc:
        say(f"gt remote worker: dropped {peer} before its worker started: {exc}")
        conn.close()
        return None
    return events, hello[2]


def _refuse(conn, say, peer: str, why: str) -> None:
    say(f"gt remote worker: refused {peer}: {why}")
    try:
        conn.send(("refused", f"the remote worker refused this client: {why}"))
    except OSError:
        pass
    conn.close()


def _kind(msg) -> str:
    return f"a {type(msg).__name__}" if msg is not None else "nothing"


def end_with_parent(sig: int = signal.SIGTERM) -> bool:
    """This process gets ``sig`` when its parent ends (Linux); False if it already has."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    return os.getppid() != 1  # (1: the parent ended before the line above)


def _worker(conn, events, options) -> None:
    """The worker process of one client: it ends with the listener."""
    if not end_with_parent():
        return
    from gt_core.worker_process.ending import run_then_end
    from gt_core.worker_process.serve import worker_main

    run_then_end(worker_main, conn, events, options, inline=True)
