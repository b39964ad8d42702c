"""The cyclic collector while captures run: what is long-lived is set aside (``gc.freeze``).

Recording makes many small objects (proxies, instructions), so the collector runs often, and
each full collection walks every object it tracks: hundreds of thousands once a library such
as transformers is imported, a full collection in a step's first calls costing as much as
tens of steps (docs/benchmarks.md). So the objects alive where the first capture begins are
frozen, and once more, once per capture, where a step is first seen inside it (a jitted
function's first call, the worker's first plan): a model, its optimizer and its data built
inside the capture live as long as it does. Everything made later is collected as before.
At the last capture's end all of it is collectable again; a cycle among the frozen objects
waits until then, so at most the garbage alive at those two moments is kept that long.
"""

from __future__ import annotations

import gc

__all__ = ["freeze", "set_aside", "unfreeze"]

_state = {"frozen": False, "aside": False}


def freeze() -> None:
    """The first capture begins: the objects alive now are set aside until the last ends."""
    if gc.isenabled():
        gc.freeze()
        _state["frozen"], _state["aside"] = True, False


def set_aside() -> None:
    """A step is first seen in this capture: the objects alive now are set aside too (once
    per capture; any thread)."""
    if _state["frozen"] and not _state["aside"]:
        _state["aside"] = True
        gc.freeze()


def unfreeze() -> None:
    """The last capture ended: every object is the collector's again."""
    if _state["frozen"]:
        _state["frozen"] = _state["aside"] = False
        gc.unfreeze()
