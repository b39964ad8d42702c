"""``%gt explore [SIG]``: one hot path's graph, source lines, code, compile and diffs.

``explore(sig=None)`` returns the widget (ipywidgets 8) over the report's plain data (what
gt_core.observe.explore folds into each hot path). Importing this package imports
ipywidgets, never torch.
"""

from __future__ import annotations

import sys

from . import _data
from ._widget import TABS, Explorer

__all__ = ["explore", "Explorer", "TABS"]


def explore(sig: str | None = None, data: dict | None = None, namespace=None) -> Explorer:
    """The explorer of hot path ``sig`` (a prefix will do; None: the step's, or where its lines
    are not known yet the latest one whose are), over ``data`` (default: the report of
    everything gt saw since the last reset); the user's compiled functions are looked up by
    name in ``namespace`` (default: the caller's globals) for their guards."""
    if data is None:
        import gt_core  # noqa: PLC0415

        data = gt_core.report().to_data()
    if sig is None:
        from .._tables import primary  # noqa: PLC0415

        if data["hot_paths"]:
            keys = [k for _, k in _data.choices(data)]
            sig = _data.first_shown(data, keys, primary(data))
    if namespace is None:
        namespace = sys._getframe(1).f_globals
    return Explorer(data, sig, namespace)
