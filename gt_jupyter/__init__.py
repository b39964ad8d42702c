"""gt for IPython and Jupyter: ``%load_ext gt_jupyter``, then ``%%gt`` cells and ``%gt`` commands.

Importing this package imports neither torch nor plotly; ``%%gt`` imports
the core (and torch) the first time a cell runs.
"""

from __future__ import annotations

__all__ = [
    "load_ipython_extension",
    "unload_ipython_extension",
    "Dashboard",
    "LiveUpdater",
    "explore",
]


def load_ipython_extension(ip) -> None:
    """Register ``%%gt`` and ``%gt`` (what ``%load_ext gt_jupyter`` calls; twice is harmless)."""
    from .magics import load  # noqa: PLC0415

    load(ip)


def unload_ipython_extension(ip) -> None:
    """Remove the magics and stop the worker if one was started."""
    from .magics import unload  # noqa: PLC0415

    unload(ip)


def __getattr__(name: str):
    if name in ("Dashboard", "LiveUpdater"):
        from . import dashboard  # noqa: PLC0415

        return getattr(dashboard, name)
    if name == "explore":  # (ipywidgets, imported on first use)
        from ._explore import explore  # noqa: PLC0415

        return explore
    raise AttributeError(f"module 'gt_jupyter' has no attribute {name!r}")
