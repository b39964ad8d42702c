"""A worker group's ranks in the report: each rank's runs, step time, compiled blocks,
collectives, its hot path's input placements and the ops a sharding group ran replicated,
from its newest ``worker.rank`` event (plain data, no torch)."""

from __future__ import annotations

from gt_core.observe import events as ev

__all__ = ["summarize_ranks", "lines", "COLUMNS", "rows"]

COLUMNS = ("rank", "pid", "runs", "step ms", "compiled", "collectives/step", "inputs")


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
        out.append(
            {
                "rank": rank,
                "world": e.get("world"),
                "pid": e.get("pid"),
                "runs": runs,
                "compiled_runs": e.get("runs", {}).get("compiled", 0),
                "step_ms": e.get("step_ms"),
                "compiled": list(e.get("compiled", [])),
                "collectives": e.get("collectives", 0),
                "collectives_per_step": e.get("collectives", 0) / runs if runs else None,
                "placements": _placements(e.get("placements")),
                # the ops a sharding group ran on whole values, and why (worker.sharded)
                "replicated": [
                    {"op": op, "reason": why} for op, why in e.get("replicated", {}).items()
                ],
            }
        )
    return out


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
            "collectives/step": (
                "-" if r["collectives_per_step"] is None else f"{r['collectives_per_step']:.3f}"
            ),
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
            f"compiled {r['compiled']}, {r['collectives/step']} collectives per step, "
            f"inputs {r['inputs']}"
        )
    for x in ranks[0]["replicated"]:
        out.append(f"  ran replicated (sharded values made whole): {x['op']}: {x['reason']}")
    return out
