"""Signals: user-marked block boundaries (``with gt_core.signal.context("training_loop"):``).

A signal's block is a candidate hot path of its own; with ``compile: true`` for its name in
the GT_CONFIG YAML it compiles on its second occurrence, without waiting for the threshold.
"""

from __future__ import annotations

import contextlib

from gt_core.stream.instructions import MARK, Mark

__all__ = ["context"]


@contextlib.contextmanager
def context(name: str):
    """Mark the instructions inside the block as one occurrence of the signal ``name``."""
    from gt_core.client.capture import session

    s = session()
    s.emit(Mark(MARK, str(name), "enter"))
    try:
        yield
    finally:
        if not s.closed:
            s.emit(Mark(MARK, str(name), "exit"))
