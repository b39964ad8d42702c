"""A hot path's states, named once for the engine that sets them and the UI that shows them.

``recording → hot → compiling → compiled``; ``failed`` (the compile or a compiled run
failed: eager from then on), ``reverted`` (slower than eager: eager again) and ``retired``
(matched no more: its instructions belong to a longer period's hot path; final). Each state is
its own name as a string, so events, reports and JSON logs carry plain strings. The worker's
moves between them are one table, ``TRANSITIONS`` (what each state may become, and when).
"""

from __future__ import annotations

import enum

__all__ = ["Status", "TRANSITIONS", "enter", "sequence"]


class Status(str, enum.Enum):
    """A hot path's state, in the order a healthy one goes through them."""

    RECORDING = "recording"
    HOT = "hot"
    COMPILING = "compiling"
    COMPILED = "compiled"
    FAILED = "failed"
    REVERTED = "reverted"
    RETIRED = "retired"

    # Shown as the bare name ("compiled"), in f-strings and tables alike.
    __str__ = str.__str__
    __format__ = str.__format__


# The worker's hot-path lifecycle, the one table: what each state may become, and on what.
# ``recording`` is the client's (before the worker found the block); ``retired`` is the
# client's fold of a block matched no more. On the worker retirement is no state of this
# table but a record beside it (Block.retirement: why, and which hot path runs it): a block
# in any state may be retired, failed and reverted ones too (final here), a compile under
# way still moves it while it is retired, and its revival says the state it is in then.
TRANSITIONS: dict[Status, dict[Status, str]] = {
    Status.HOT: {
        Status.COMPILING: "a compile is scheduled (in the background, or after two eager runs)",
        Status.FAILED: "its inputs cannot be compiled for (storages shared across dtypes)",
    },
    Status.COMPILING: {
        Status.COMPILED: "the compile finished",
        Status.FAILED: "the compile raised",
        Status.HOT: "its hot path was retired meanwhile: the compile was cancelled",
    },
    Status.COMPILED: {
        Status.COMPILING: "a run's inputs share memory otherwise: compiled again for them",
        Status.FAILED: "a compiled run, or its eager graph on copies, raised",
        Status.REVERTED: "its first run differed from eager, or it ran slower than eager",
    },
    # (final: the block runs its eager graph, or its instructions, from then on)
    Status.REVERTED: {},
    Status.FAILED: {},
}


def enter(states: list, state: Status, t: float | None) -> None:
    """Note that a hot path entered ``state`` at ``t`` (``states``: ``[state, t]`` pairs in
    order); staying in a state is no new entry."""
    if not states or states[-1][0] != state:
        states.append([state, t])


def sequence(states: list) -> str:
    """``"recording 0.0 s → hot 0.4 s → compiling 0.5 s → compiled 2.1 s"``: each state with
    the seconds since the first one was entered (a state of unknown time shows without)."""
    t0 = next((t for _, t in states if isinstance(t, (int, float))), None)
    return " → ".join(
        f"{s} {t - t0:.1f} s" if isinstance(t, (int, float)) and t0 is not None else str(s)
        for s, t in states
    )
