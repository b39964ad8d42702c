"""A worker group on this machine: N spawned ranks of one torch.distributed group (SPMD).

``capture(workers=N)`` (``%%gt --workers N``, ``GT_WORKERS=N``) starts N worker processes
that meet as one process group (gloo on the CPU, one intra-op thread each). Every message
goes to every rank, in the same order, so each runs the same stream; rank 0 answers requests
and its events are the report's, the other ranks' events are folded into one line per rank
(``worker.rank``: its runs, compiled blocks, step time). See gt_core.worker_process.group for what the
ranks agree on. Uploads travel inside the messages (written once per rank); fetches come from
rank 0 through shared memory, as from one worker.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import pickle
import shutil
import tempfile
import threading

from gt_core.client.transports.exits import exit_reason
from gt_core.client.transports.rank_lines import RankLines
from gt_core.client.transports.tcp import InlineStaging
from gt_core.client.transports.transport import ProcessTransport, without_main
from gt_core.errors import ConfigError

__all__ = ["GroupTransport"]


class _Fanout:
    """Rank 0's connection for reading; every rank's for writing (the same bytes to each)."""

    def __init__(self, conns):
        self.conns = conns
        self.first = conns[0]

    def send_bytes(self, data) -> None:
        for c in self.conns:
            c.send_bytes(data)

    def send(self, obj) -> None:
        for c in self.conns:
            c.send(obj)

    def recv(self):
        return self.first.recv()

    def poll(self, timeout=0.0):
        return self.first.poll(timeout)

    def close(self) -> None:
        for c in self.conns:
            c.close()


class GroupTransport(RankLines, InlineStaging, ProcessTransport):
    """N local ranks behind one transport; rank 0 is the worker the client talks to."""

    def __init__(self, options, on_events, start_timeout: float = 180.0):
        self._init_ranks()
        self._batches = collections.Counter()  # event batches received from each rank > 0
        self._arrived = threading.Condition()
        super().__init__(options, self._tap(on_events), start_timeout)

    def _open(self, options):
        from gt_core.worker_process.cpu_share import worker_environment
        from gt_core.worker_process.ending import run_then_end
        from gt_core.worker_process.group import GroupSpec
        from gt_core.worker_process.serve import worker_main

        n = self.world = options.workers
        _check_shard_workers(options, n)
        ctx = mp.get_context("spawn")
        self._dir = tempfile.mkdtemp(prefix="gt-group-")
        init = "file://" + os.path.join(self._dir, "rendezvous")
        self.procs, conns, events = [], [], []
        for r in range(n):
            conn, child = ctx.Pipe()
            events_conn, child_events = ctx.Pipe(duplex=False)
            spec = GroupSpec(r, n, init)
            p = ctx.Process(
                target=run_then_end,
                args=(worker_main, child, child_events, options, False, spec),
                daemon=True,
                name=f"gt-worker-rank{r}",
            )
            # (one OpenMP thread each: N ranks share the cores)
            with without_main(), worker_environment(OMP_NUM_THREADS="1"):
                p.start()
            child.close()
            child_events.close()
            self.procs.append(p)
            conns.append(conn)
            events.append(events_conn)
        self.proc = self.procs[0]
        self.pid = self.proc.pid
        for r in range(1, n):
            threading.Thread(
                target=self._pump, args=(r, events[r]), name=f"gt-events-rank{r}", daemon=True
            ).start()
        return _Fanout(conns), events[0]

    @property
    def name(self) -> str:
        return f"gt worker group ({len(self.procs)} ranks, rank 0 pid {self.pid})"

    def _running(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def _ended(self) -> str:
        """Which rank ended and why; the others end too (they would wait in collectives)."""
        why = "its connection broke"
        for r, p in enumerate(self.procs):
            if not p.is_alive():
                p.join(timeout=1.0)
                why = f"rank {r} (pid {p.pid}) ended: {exit_reason(p.exitcode)}"
                break
        self.kill()
        return why

    def _join(self) -> None:
        for p in self.procs:
            p.join(timeout=5)
        self.kill()

    def kill(self) -> None:
        """A rank that ends leaves the others waiting in a collective: all of them end."""
        for p in self.procs:
            if p.is_alive():
                p.kill()
        for p in self.procs:
            p.join(timeout=2)

    def stop(self) -> None:
        super().stop()
        self.kill()  # (a rank left alone would wait in a collective for the one gone)
        for c in self._conn.conns:
            c.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- each rank's own line -------------------------------------------------------------
    def _tap(self, on_events):
        def tapped(events):
            self._see(0, events)
            on_events(events)

        return tapped

    def _pump(self, rank: int, conn) -> None:
        while True:
            try:
                events = conn.recv()
            except (EOFError, OSError):
                return
            self._see(rank, events)
            with self._arrived:
                self._batches[rank] += 1
                self._arrived.notify_all()

    def drain(self, timeout: float = 10.0) -> None:
        """Every rank's events so far are in: each rank answers ``events_sent`` (the one
        request ranks > 0 answer), with how many batches it has published."""
        super().drain(timeout)
        for rank, conn in enumerate(self._conn.conns[1:], 1):
            sent = None
            while sent is None and conn.poll(timeout):  # (an interrupted drain's answer first)
                rid, _, value = pickle.loads(conn.recv_bytes())
                sent = value if rid >= self.last_rid else None
            with self._arrived:
                self._arrived.wait_for(lambda r=rank, n=sent or 0: self._batches[r] >= n, timeout)


def _check_shard_workers(options, n: int) -> None:
    """A signal's ``shard: {workers: [...]}`` names every rank of the group (or is left out):
    a tensor is split over the whole group."""
    for name, spec in options.signals.items():
        workers = spec.get("shard", {}).get("workers")
        if workers is not None and sorted(workers) != list(range(n)):
            raise ConfigError(
                f"signal {name!r} shard workers",
                workers,
                f"every rank of the group, {list(range(n))} (a tensor is split over the whole "
                "group), or no workers: name them all, or change workers",
            )
