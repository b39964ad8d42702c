"""A hot path's states, named once for the engine that sets them and the UI that shows them.

``recording → hot → compiling → compiled``; ``failed`` (the compile or a compiled run
failed: eager from then on), ``reverted`` (slower than eager: eager again) and ``retired``
(matched no more: its instructions belong to a longer period's hot path; final). Each state is
its own name as a string, so events, reports and JSON logs carry plain strings.
"""

from __future__ import annotations

import enum

__all__ = ["Status", "enter", "sequence"]


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
