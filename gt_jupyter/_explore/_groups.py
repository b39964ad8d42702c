"""A block's ops in nested groups: phase, then each level of the nn.Module path.

``forward`` holds ``forward · encoder``, which holds ``forward · encoder.layer.0``, and so on
down to the ops. A group not opened is drawn as one node; the first view opens levels while
the graph stays within ``MAX_NODES`` op nodes, so a 500-op block reads at a glance and an
MLP's shows its layers. A group of one op is never drawn as a group.
"""

from __future__ import annotations

__all__ = ["MAX_NODES", "chain", "groups", "shown_as", "auto_open", "ops_of"]

MAX_NODES = 30  # op nodes of the first view, at most
_PHASES = ("forward", "backward", "optimizer")


def ops_of(canonical: dict) -> list[dict]:
    return [e for e in canonical["entries"] if e["kind"] == "op"]


def chain(entry: dict) -> list[str]:
    """The groups an op sits in, outermost first: its phase, then each module prefix (an
    optimizer's op: its optimizer's class)."""
    phase = entry.get("phase") or "other"
    module = entry.get("module")
    parts = module.split(".") if module else [entry.get("optimizer") or "(no module)"]
    return [phase] + [f"{phase} · {'.'.join(parts[: i + 1])}" for i in range(len(parts))]


def groups(canonical: dict) -> list[tuple[str, int]]:
    """(group, ops in it) of every group of two ops or more: by phase, then by first op."""
    count: dict[str, int] = {}
    first: dict[str, tuple] = {}
    for k, e in enumerate(ops_of(canonical)):
        rank = _PHASES.index(e["phase"]) if e.get("phase") in _PHASES else len(_PHASES)
        for g in chain(e):
            count[g] = count.get(g, 0) + 1
            first.setdefault(g, (rank, k, len(g)))
    return [(g, count[g]) for g in sorted(count, key=first.__getitem__) if count[g] > 1]


def shown_as(entry: dict, opened, sizes: dict) -> str | None:
    """The group an op is drawn in (None: itself, each of its groups opened or a single op)."""
    for g in chain(entry):
        if g not in opened and sizes.get(g, 1) > 1:
            return g
    return None


def _nodes(ops: list[dict], opened, sizes: dict) -> int:
    shown = [shown_as(e, opened, sizes) for e in ops]
    return len({g for g in shown if g}) + sum(g is None for g in shown)


def auto_open(canonical: dict, limit: int = MAX_NODES) -> set[str]:
    """The groups the first view opens: level by level while at most ``limit`` nodes show."""
    ops, sizes = ops_of(canonical), dict(groups(canonical))
    opened: set[str] = set()
    while True:
        more = opened | {g for g in (shown_as(e, opened, sizes) for e in ops) if g}
        if more == opened or _nodes(ops, more, sizes) > limit:
            return opened
        opened = more
