"""What the explorer shows of a hot path, folded from its events: its canonical form with the
user's line, module and phase of each entry, its code, its compile phases and its lines.

``annotate`` adds to each hot path of the report (gt_core.observe.report.summarize):
``canonical`` (the detection's plain form, each entry with ``source``, ``text``, ``module``,
``phase`` and ``optimizer``, the class name of the optimizer whose step recorded an op of
the optimizer phase; None where unknown), ``code`` ({"fx", "generated"} or None until compiled),
``compile_phases`` ({phase: seconds}), ``cache`` ("hit", "miss" or None) and ``lines``
([{"source", "text", "ops", "share"}], in the order the block first records them; ``share``
is the line's part of the block's time in its profiled eager runs, None without a profile).
No torch import.
"""

from __future__ import annotations

from gt_core.observe import events as ev

__all__ = ["annotate", "annotated", "lines", "client_lines"]

_SITE = ("source", "text", "module", "phase", "optimizer")
_NO_SITE = dict.fromkeys(_SITE)

# Annotated forms, built once per (detection, sites) pair: the dashboard folds the report
# often, the forms change only when a new event comes.
_BUILT: dict[tuple[int, int], tuple] = {}
_KEEP = 64


def annotate(hot_paths: list[dict], events: list[dict]) -> None:
    """Add the explorer's fields to each of ``hot_paths`` from ``events`` (all of them)."""
    last: dict[tuple[str, str], dict] = {}
    for e in events:
        t = e.get("type")
        if t in ev.FORMS:
            t = ev.DETECTED  # (a known block's form, said again after a reset)
        if t in (ev.DETECTED, ev.SITES, ev.COMPILE_FINISHED):
            last[(t, e.get("signature"))] = e
    for p in hot_paths:
        sig = p["signature"]
        detected = last.get((ev.DETECTED, sig))
        if detected is not None and not detected.get("canonical"):
            detected = None
        sites = last.get((ev.SITES, sig))
        done = last.get((ev.COMPILE_FINISHED, sig)) or {}
        p["canonical"] = annotated(detected, sites)
        p["code"] = done.get("code")
        p["compile_phases"] = dict(done.get("phases") or {})
        # (a block loaded from gt's block cache: the phases of the compile that made it)
        p["kept_phases"] = dict(done.get("kept_phases") or {})
        p["cache"] = done.get("cache")
        p["lines"] = lines(p["canonical"], (detected or {}).get("op_ms"))


def annotated(detected: dict | None, sites: dict | None) -> dict | None:
    """The detection's canonical form, each entry with its site (None: no detection)."""
    if detected is None:
        return None
    key = (id(detected), id(sites))
    hit = _BUILT.get(key)
    if hit is not None and hit[0] is detected and hit[1] is sites:
        return hit[2]
    canon = detected["canonical"]
    where = (sites or {}).get("entries") or []
    if len(where) != len(canon["entries"]):
        where = [None] * len(canon["entries"])  # (sites of another form: none shown)
    entries = [{**e, **(w if w else _NO_SITE)} for e, w in zip(canon["entries"], where)]  # noqa: B905
    out = {**canon, "entries": entries}
    if len(_BUILT) >= _KEEP:
        _BUILT.pop(next(iter(_BUILT)))
    _BUILT[key] = (detected, sites, out)
    return out


def lines(canonical: dict | None, op_ms: list | None) -> list[dict]:
    """The user's lines that recorded a block's ops: how many ops each, its share of time."""
    if canonical is None:
        return []
    entries = canonical["entries"]
    timed = op_ms if op_ms and len(op_ms) == len(entries) else None
    total = sum(x for x in timed if x) if timed else 0.0
    out: dict[str, dict] = {}
    for k, e in enumerate(entries):
        if e["kind"] != "op" or not e.get("source"):
            continue
        line = out.setdefault(
            e["source"], {"source": e["source"], "text": e.get("text") or "", "ops": 0, "ms": 0.0}
        )
        line["ops"] += 1
        line["ms"] += (timed[k] or 0.0) if timed else 0.0
    for line in out.values():
        ms = line.pop("ms")
        line["share"] = round(ms / total, 4) if total else None
    return list(out.values())


def client_lines(events: list[dict], since: int = 0) -> dict:
    """{"syncs": {"file:line": n}, "uploads": {...}}: the client's count per line, from
    ``since`` on (a cell's view: its latest count less the latest before the view; the
    client's counts run over its session)."""
    now, before = _latest_lines(events, len(events)), _latest_lines(events, since)
    return {
        kind: {
            src: n - before[kind].get(src, 0)
            for src, n in now[kind].items()
            if n > before[kind].get(src, 0)
        }
        for kind in ("syncs", "uploads")
    }


def _latest_lines(events: list[dict], end: int) -> dict:
    for i in range(end - 1, -1, -1):
        e = events[i]
        if e.get("type") == ev.CLIENT_LINES:
            return {"syncs": dict(e.get("syncs", {})), "uploads": dict(e.get("uploads", {}))}
    return {"syncs": {}, "uploads": {}}
