"""What a session tells the report of the client's side: its counters, per hot path the
client's ms, per jit call key its replays."""

from __future__ import annotations

import statistics

from gt_core.observe import events as ev

__all__ = ["publish_stats", "jit_stats"]


def publish_stats(s) -> None:
    """Session ``s``'s counters, per hot path its ms, per jit call key its replays (a new key
    at 0: the report lists it while it records): only what moved since the last publish."""
    s.matcher.lines.publish(s.counters)  # the counters, then syncs and uploads per line
    s.log.extend(getattr(s.transport, "rank_events", list)())  # (a worker group's)
    sent = s.stats_sent
    for sig, n in s.matcher.client_runs.items():
        if sent.get(sig) != n:
            sent[sig] = n
            ms = statistics.median(s.matcher.client_ms[sig])
            s.log.emit(ev.CLIENT_STATS, signature=sig, runs=n, client_ms=ms)
    for entry in s.jits:
        if sent.get(entry) != entry.replayed:
            sent[entry] = entry.replayed
            s.log.emit(ev.JIT_STATS, **jit_stats(entry))


def jit_stats(entry) -> dict:
    """A jit call key's replays and audits (jit.entry.Entry), and the client's ms per replay."""
    return {
        "function": entry.owner.name,
        "name": entry.name,
        "signature": entry.sig,
        "replayed": entry.replayed,
        "audited": entry.audited,
        "client_ms": statistics.median(entry.client_ms) if entry.client_ms else None,
    }
