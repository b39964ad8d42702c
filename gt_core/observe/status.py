"""A hot path's states, named once for the engine that sets them and the UI that shows them.

``recording → hot → compiling → compiled``; ``failed`` (the compile or a compiled run
failed: eager from then on) and ``reverted`` (slower than eager: eager again). Each state is
its own name as a string, so events, reports and JSON logs carry plain strings.
"""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(str, enum.Enum):
    """A hot path's state, in the order a healthy one goes through them."""

    RECORDING = "recording"
    HOT = "hot"
    COMPILING = "compiling"
    COMPILED = "compiled"
    FAILED = "failed"
    REVERTED = "reverted"

    # Shown as the bare name ("compiled"), in f-strings and tables alike.
    __str__ = str.__str__
    __format__ = str.__format__
