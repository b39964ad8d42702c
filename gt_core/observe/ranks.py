"""A worker group's ranks in the report: each rank's runs, step time, compiled blocks,
collectives (count and bytes by kind, per step and so far), its hot path's input placements
and the ops a sharding group ran replicated, from its newest ``worker.rank`` event (plain
data, no torch)."""

from __future__ import annotations

from gt_core.observe import events as ev
from gt_core.observe.feeding import size

__all__ = ["summarize_ranks", "lines", "COLUMNS", "rows"]

COLUMNS = (
    "rank",
    "pid",
    "runs",
    "step ms",
    "compiled",
    "collectives/step",
    "bytes/step",
    "inputs",
)


def summarize_ranks(events: list[dict]) -> list[dict]:
    """The newest line of each rank, by rank ([] for one worker)."""
    newest: dict[int, dict] = {}
    for e in events:
        if e.get("type") == ev.RANK:
            newest[e["rank"]] = e
    out = []
    for rank in sorted(newest):
        e = newest[rank]
        runs = sum(e.get("runs", {}).values())
        step = _kinds(e.get("comm_step")) if e.get("comm_step") is not None else None
        out.append(
            {
                "rank": rank,
                "world": e.get("world"),
                "pid": e.get("pid"),
                "runs": runs,
                "compiled_runs": e.get("runs", {}).get("compiled", 0),
                "step_ms": e.get("step_ms"),
                "compiled": list(e.get("compiled", [])),
                # every collective the rank ran so far (gt's agreements, DTensor's, a
                # compiled block's), and those of one step: {kind: {count, bytes}}
                "collectives": e.get("collectives", 0),
                "comm": _kinds(e.get("comm")),
                "comm_per_step": step,
                "collectives_per_step": _total(step, "count"),
                "bytes_per_step": _total(step, "bytes"),
                "placements": _placements(e.get("placements")),
                # the ops a sharding group ran on whole values, and why (worker.sharded)
                "replicated": [
                    {"op": op, "reason": why} for op, why in e.get("replicated", {}).items()
                ],
            }
        )
    return out


def _kinds(comm: dict | None) -> dict:
    """``{kind: (count, bytes)}`` as ``{kind: {"count": n, "bytes": b}}``, by kind."""
    return {k: {"count": v[0], "bytes": v[1]} for k, v in sorted((comm or {}).items())}


def _total(comm: dict | None, field: str) -> int | None:
    return None if comm is None else sum(v[field] for v in comm.values())


def _comm(comm: dict | None) -> str:
    """'2 (all_reduce 2)', '3 (all_gather 1, all_reduce 2)'; '-' if unknown, '0' if none."""
    if comm is None:
        return "-"
    total = sum(v["count"] for v in comm.values())
    kinds = ", ".join(f"{k} {v['count']}" for k, v in comm.items())
    return f"{total} ({kinds})" if kinds else "0"


def _comm_bytes(comm: dict | None) -> str:
    """'813.1 KB (all_reduce 813.1 KB)'; '-' if unknown."""
    if comm is None:
        return "-"
    total = sum(v["bytes"] for v in comm.values())
    kinds = ", ".join(f"{k} {size(v['bytes'])}" for k, v in comm.items())
    return f"{size(total)} ({kinds})" if kinds else size(0)


def _placements(counts: dict | None) -> str:
    """The compiled hot path's inputs by placement, 'Shard(dim=0) x2, Replicate() x8' (no
    sharding: every input whole on every rank)."""
    if not counts:
        return "Replicate() for every input"
    return ", ".join(f"{p} x{n}" for p, n in counts.items())


def rows(ranks: list[dict]) -> list[dict]:
    """The ranks as table rows (COLUMNS)."""
    return [
        {
            "rank": r["rank"],
            "pid": r["pid"],
            "runs": f"{r['runs']} ({r['compiled_runs']} compiled)",
            "step ms": "-" if r["step_ms"] is None else f"{r['step_ms']:.3f}",
            "compiled": ", ".join(r["compiled"]) or "-",
            "collectives/step": _comm(r["comm_per_step"]),
            "bytes/step": _comm_bytes(r["comm_per_step"]),
            "inputs": r["placements"],
        }
        for r in ranks
    ]


def lines(ranks: list[dict]) -> list[str]:
    """The report's lines for a worker group ([] for one worker)."""
    if not ranks:
        return []
    out = [
        f"worker group: {ranks[0]['world']} ranks (torch.distributed), every rank runs the "
        f"stream; hot path inputs: {ranks[0]['placements']}"
    ]
    for r in rows(ranks):
        out.append(
            f"  rank {r['rank']} (pid {r['pid']}): {r['runs']} runs, step {r['step ms']} ms, "
            f"compiled {r['compiled']}, collectives per step {r['collectives/step']}, "
            f"{r['bytes/step']}, inputs {r['inputs']}"
        )
    for x in ranks[0]["replicated"]:
        out.append(f"  ran replicated (sharded values made whole): {x['op']}: {x['reason']}")
    return out
