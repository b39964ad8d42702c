"""Each rank's line of a worker group (``worker.rank`` events), from the events every rank
publishes (tagged with its rank): its runs, step time, compiled blocks, collectives, its hot
path inputs' placements and the ops it ran replicated. A local group's transport and a
remote one (a torchrun group behind its rank 0) keep them alike."""

from __future__ import annotations

import collections
import itertools
import statistics
import threading

from gt_core.observe import events as ev

__all__ = ["RankLines"]

_RECENT = 64  # a rank's newest iteration times kept (its step time is their median)
_STEPS = 16  # a rank's newest steps whose collectives are compared (see _step_comm)


class RankLines:
    """The ranks' lines, fed each rank's events (``_see``), read as events (``rank_events``)."""

    world = None  # the group's size (a GROUP event says it)

    def _init_ranks(self) -> None:
        self.ranks: dict[int, dict] = {}
        self._rank_lock = threading.Lock()
        self._sent_ranks: dict[int, tuple] = {}

    def _see(self, rank: int, events) -> None:
        with self._rank_lock:
            r = self.ranks.get(rank)
            if r is None:
                r = self.ranks[rank] = {
                    "rank": rank,
                    "runs": collections.Counter(),
                    "compiled": set(),
                    "recent": collections.deque(maxlen=_RECENT),
                    "comm": {},
                    "steps": {},  # signature -> its runs' comm, newest last
                    "by_sig": collections.Counter(),  # runs by signature
                }
            for e in events:
                t = e.get("type")
                if t == ev.ITERATION:
                    r["runs"][e.get("kind")] += 1
                    r["recent"].append(e["ms"])
                    if "comm" in e:
                        sig = e.get("signature")
                        r["by_sig"][sig] += 1
                        r["steps"].setdefault(sig, collections.deque(maxlen=_STEPS + 1))
                        r["steps"][sig].append(e["comm"])
                elif t == ev.COMPILE_FINISHED:
                    r["compiled"].add(e["signature"])
                    if "placements" in e:  # (a sharding group's: its inputs' placements)
                        r["placements"] = e["placements"]
                elif t in (ev.COMPILE_FAILED, ev.FALLBACK, ev.CHECK_FAILED, ev.REVERT):
                    r["compiled"].discard(e.get("signature"))
                elif t == ev.SHARDED:  # (kept here: the event log's reset forgets it)
                    r.setdefault("replicated", {})[e["op"]] = e["reason"]
                elif t == ev.WORKER and "pid" in e:
                    r["pid"] = e["pid"]
                if "comm" in e:
                    r["comm"] = e["comm"]
                if t == ev.GROUP:
                    self.world = e.get("world", self.world)

    def rank_events(self) -> list[dict]:
        """One ``worker.rank`` event per rank whose line changed since the last call."""
        out = []
        with self._rank_lock:
            for rank, r in sorted(self.ranks.items()):
                line = {
                    "rank": rank,
                    "world": self.world,
                    "pid": r.get("pid"),
                    "runs": dict(r["runs"]),
                    "compiled": sorted(r["compiled"]),
                    "step_ms": statistics.median(r["recent"]) if r["recent"] else None,
                    "collectives": sum(n for n, _ in r["comm"].values()),
                    "comm": dict(r["comm"]),
                    "comm_step": _step_comm(r),
                    "placements": r.get("placements"),
                    "replicated": dict(r.get("replicated", {})),
                }
                key = tuple(sorted((k, str(v)) for k, v in line.items()))
                if self._sent_ranks.get(rank) != key:
                    self._sent_ranks[rank] = key
                    out.append(ev.event(ev.RANK, **line))
        return out


def _step_comm(r: dict) -> dict | None:
    """A step's collectives on a rank, ``{kind: (count, bytes)}``: the most frequent of the
    differences between the collectives so far at consecutive runs of its most run block
    (a run to the next is one step; a compile's agreements or a fetch now and then do not
    move it). None before such a block has run twice."""
    if not r["by_sig"]:
        return None
    runs = r["steps"][r["by_sig"].most_common(1)[0][0]]
    if len(runs) < 2:
        return None
    diffs = []
    for a, b in itertools.pairwise(runs):
        d = {k: (n - a.get(k, (0, 0))[0], nb - a.get(k, (0, 0))[1]) for k, (n, nb) in b.items()}
        diffs.append(tuple(sorted((k, v) for k, v in d.items() if v[0])))
    seen = collections.Counter(diffs)
    best = max(range(len(diffs)), key=lambda i: (seen[diffs[i]], i))  # (ties: the newest)
    return dict(diffs[best])
