"""One known cause of a recompile, graph break, skip or gt hot-path outcome (see causes)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Cause"]


@dataclass(frozen=True)
class Cause:
    """One known cause: where it occurs, how to recognise it, what it means and what to do.

    ``cause`` and ``fix`` are format strings over the pattern's named groups.
    """

    id: str
    kinds: tuple[str, ...]
    pattern: str
    cause: str
    fix: str

    def match(self, kind: str, reason: str) -> dict | None:
        if kind not in self.kinds:
            return None
        m = re.search(self.pattern, reason, re.S)
        return None if m is None else {k: v or "" for k, v in m.groupdict().items()}
