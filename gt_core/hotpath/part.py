"""What every part of the engine shares: the capture's options, which the engine changes."""

from __future__ import annotations

__all__ = ["Part"]


class Part:
    """A part of the engine (gt_core.hotpath.engine wires them): it reads ``options``, the
    current capture's, and the engine gives it a new capture's through ``use_options``."""

    options: object  # (gt_core.options.Options)

    def use_options(self, options) -> None:
        """The engine's options changed (a new capture's): read from now on."""
        self.options = options
