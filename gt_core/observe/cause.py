"""One known cause of a recompile, graph break, skip or gt hot-path outcome (see causes)."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Cause"]


@dataclass(frozen=True)
class Cause:
    """One known cause: where it occurs, how to recognise it, what it means and what to do.

    ``cause`` and ``fix`` are format strings over the pattern's named groups. ``tries``:
    options worth trying, each ``(option, value, words, unless)``; ``fix``'s ``{tries}``
    becomes the words of those that fit the options in use (:meth:`tries_for`).
    """

    id: str
    kinds: tuple[str, ...]
    pattern: str | None  # None: chosen by its id from a typed record, never by a reason's words
    cause: str
    fix: str
    tries: tuple[tuple[str, object, str, tuple], ...] = ()

    def tries_for(self, options: dict | None) -> str:
        """The words of the tries that fit ``options`` (None: unknown, all fit): never an
        option already set to that value, nor one whose current value is in ``unless``."""
        options = options or {}
        return "".join(
            words
            for option, value, words, unless in self.tries
            if option not in options or (options[option] != value and options[option] not in unless)
        )

    def match(self, kind: str, reason: str) -> dict | None:
        if kind not in self.kinds or self.pattern is None:
            return None
        m = re.search(self.pattern, reason, re.S)
        return None if m is None else {k: v or "" for k, v in m.groupdict().items()}
