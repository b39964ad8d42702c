"""gt_core.jit in the report: one entry per jitted function's call key, its state and why.

A refusal often comes before the function's block exists (a sync, a Python number that
changed): its event names no hot path, so the entries are kept apart from the hot paths,
keyed by the entry's name (one per call key, gt_core.client.jit.entry.Entry); the block its
calls made, where the worker detected one, names the entry's marks as its ``signal``.
No torch import.
"""

from __future__ import annotations

from gt_core.observe import events as ev
from gt_core.observe.jit_states import JitReason, JitState

__all__ = ["JitState", "summarize_jit", "lines", "counts"]


def _owner(name: str) -> str:
    """The jitted function an entry's name belongs to (its name less the key's number)."""
    return name.rsplit(":", 1)[0]


def summarize_jit(events: list[dict], since: int = 0) -> list[dict]:
    """One dict per jitted call key (active since ``since``): function, name, keys, state,
    signature, replayed (calls, in the view), client_ms, reason, frozen, constants,
    explanation."""
    entries: dict[str, dict] = {}
    before: dict[str, int] = {}  # replayed calls when the view starts
    active: set[str] = set()
    blocks: dict[str, str] = {}  # entry name -> the block its marks cut (a detected signal)
    for i, e in enumerate(events):
        t = e.get("type")
        if t in ev.FORMS and e.get("signal"):
            blocks[e["signal"]] = e.get("signature")
        if t == ev.FOLDED and e.get("of") == ev.JIT_STATS:
            e, t = e["last"], ev.JIT_STATS
        if t not in (ev.JIT, ev.JIT_STATS) or e.get("name") is None:
            continue
        name = e["name"]
        j = entries.get(name)
        if j is None:
            j = entries[name] = _new(e)
        if i >= since:
            active.add(name)
        j["signature"] = e.get("signature") or j["signature"]
        if t == ev.JIT and e.get("trigger") == "audited":
            j["audited"] = e.get("audited", j["audited"])  # (a self-loop: the state stays)
        elif t == ev.JIT:
            j["state"] = _state(e.get("state"))
            j["reason"] = e.get("reason")
            j["cause"] = e.get("cause")
            replaying = j["state"] == JitState.REPLAYING
            j["frozen"] = list(e.get("frozen") or []) if replaying else []
            j["constants"] = list(e.get("constants") or []) if replaying else []
            j["not_repeated"] = list(e.get("not_repeated") or []) if replaying else []
        else:
            j["replayed"] = e.get("replayed", 0)
            if e.get("client_ms") is not None:
                j["client_ms"] = e["client_ms"]
            if i < since:
                before[name] = j["replayed"]
    keys: dict[str, int] = {}
    for name, j in entries.items():  # (in order of first appearance)
        keys[_owner(name)] = j["key"] = keys.get(_owner(name), 0) + 1
    shown = []
    for name, j in entries.items():
        if name not in active:
            continue
        j["keys"] = keys[_owner(name)]
        j["signature"] = j["signature"] or blocks.get(name)  # (a refusal made before its block)
        j["replayed"] -= before.get(name, 0)
        cause = j.pop("cause", None)  # (the typed reason: rendered, never parsed)
        j["explanation"] = JitReason.from_data(cause).explain() if cause else None
        shown.append(j)
    return shown


def _state(s) -> JitState | str:
    """An event's state by its name (a state this module does not know stays a string)."""
    try:
        return JitState(s)
    except ValueError:
        return str(s)


def _new(e: dict) -> dict:
    return {
        "function": e.get("function"),
        "name": e["name"],
        "key": 1,  # which of its function's call keys (1, 2, ...: as they first appeared)
        "keys": 1,  # how many call keys its function has
        "state": JitState.RECORDING,
        "signature": None,
        "replayed": 0,
        "audited": 0,  # replays recorded instead and compared with the replay (all passed)
        "client_ms": None,
        "reason": None,
        "frozen": [],  # Python numbers a replay keeps as recorded: {op, arg, value, count}
        "constants": [],  # tensors made from host data a replay keeps: {shape, dtype, where}
        "not_repeated": [],  # changes of Python state the recorded call made, a replay won't
        "explanation": None,  # the reason's {id, cause, fix} (gt_core.observe.causes)
    }


def counts(entries: list[dict]) -> str:
    """``"jit: 1 replaying, 1 refused"`` ('' without jitted functions): for headlines."""
    n = {s: sum(j["state"] == s for j in entries) for s in JitState}
    said = [f"{k} {s}" for s, k in n.items() if k]
    return f"jit: {', '.join(said)}" if said else ""


def lines(entries: list[dict]) -> list[str]:
    """The report's jit section: a line per call key, then what to do where it is not
    replayed (``jit step: replaying block 22c88ddf4832, 120 calls replayed (...)``)."""
    out = []
    for j in entries:
        key = f" (key {j['key']} of {j['keys']})" if j["keys"] > 1 else ""
        head = f"jit {j['function']}{key}: "
        if j["state"] == JitState.REPLAYING:
            ms = f" ({j['client_ms']:.3g} ms per call)" if j["client_ms"] is not None else ""
            out.append(
                f"{head}replaying block {j['signature']}, {j['replayed']} calls replayed{ms}"
            )
            if j["frozen"]:
                kept = ", ".join(f"{f['value']!r} at {f['op']} {f['arg']}" for f in j["frozen"])
                out.append(f"    keeps these Python numbers as recorded: {kept}")
            if j["constants"]:
                kept = ", ".join(
                    f"{c['shape']} {c['dtype']}" + (f" (at {c['where']})" if c["where"] else "")
                    for c in j["constants"]
                )
                out.append(f"    keeps these tensors made from host data as recorded: {kept}")
            if j["not_repeated"]:
                said = "; ".join(j["not_repeated"])
                out.append(f"    does not repeat these changes of Python state: {said}")
        elif j["state"] == JitState.RECORDING:
            out.append(f"{head}recording (no two calls recorded the same block yet)")
        else:
            said = j["state"]
            if said == JitState.RERECORDING:
                said = "re-recording (that call ran its Python)"
            out.append(f"{head}{said}: {j['reason']}")
            if j["explanation"]:
                out.append(f"    -> {j['explanation']['fix']}")
    return out
