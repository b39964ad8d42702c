"""Where a hot block's ops come from: the user's line, the nn.Module and the phase of each.

Taken once per hot block, not per op: the first occurrence the client matches after the
worker sent the block's plan walks the Python stack at each of its entries (see
``plan_match.Candidate``); every later occurrence pays one ``is None`` test per op. (The
session's first capture also sites what it records before any plan, for a plan that comes
after its loop ended: gt_core.client.plans.early_sites.) The walk finds the innermost frame that
is neither gt's, torch's nor the standard library's (the user's line, as errors name it), the
``nn.Module`` calls on the stack (the innermost one's path inside the outermost), whether
the op runs in autograd's backward or in an optimizer.

Backward ops run from autograd's engine, with no module on the stack: a forward op records
its autograd node's sequence number with its module, and a backward op finds its module
through the node the engine is running (the forward op's: FX's ``seq_nr`` rule).
"""

from __future__ import annotations

import linecache
import os
import sys

import torch

from gt_core.client.interrupt import GT_DIR, LIBRARY_DIRS, user_line
from gt_core.observe import events as ev

__all__ = ["Siting", "site_data", "Lines"]

_OURS = (GT_DIR, *LIBRARY_DIRS)
_CALL = torch.nn.Module._call_impl.__code__
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_OPTIM = os.path.join(_TORCH, "optim") + os.sep
_AUTOGRAD = os.path.join(_TORCH, "autograd") + os.sep  # backward()'s own ops (its first grad)


class Siting:
    """One block's sites as its first matched occurrence goes by; shared by the occurrences
    of a plan that are candidates at once (a plan's sites are taken once)."""

    __slots__ = ("forward", "names")

    def __init__(self):
        self.forward: dict[int, str] = {}  # autograd sequence number -> its forward's module
        self.names: dict[int, dict[int, str]] = {}  # id(root module) -> {id(module): path}

    def here(self) -> tuple:
        """(file, line, module path or None, phase or None, optimizer class name or None) of
        the op recorded now."""
        f = sys._getframe(1)
        user = None
        modules: list = []
        optim = grads = False
        owner = None  # the optimizer whose step records the op (its class name)
        kinds = _KINDS
        while f is not None:
            code = f.f_code
            if code is _CALL:
                modules.append(f.f_locals.get("self"))
                f = f.f_back
                continue
            name = code.co_filename
            kind = kinds.get(name)
            if kind is None:
                kind = _kind(name)
            if kind == _USER:
                if user is None:
                    user = (name, f.f_lineno)
            elif kind == _OPTIMIZER:
                optim = True
                if owner is None:
                    owner = _optimizer(f)
            elif kind == _BACKWARD:
                grads = True
            f = f.f_back
        file, line = user or (None, None)
        node = torch._C._current_autograd_node()
        if node is not None:
            return file, line, self.forward.get(node._sequence_nr()), "backward", None
        if grads and not modules:
            return file, line, None, "backward", None
        if optim:
            return file, line, None, "optimizer", owner
        path = self._path(modules) if modules else None
        if path is not None and torch.is_grad_enabled():
            # the node this op made (if it made one): its backward ops belong to this module
            self.forward.setdefault(torch.autograd._get_sequence_nr() - 1, path)
        phase = "forward" if modules or torch.is_grad_enabled() else None
        return file, line, path, phase, None

    def _path(self, modules: list) -> str:
        """The innermost module's path inside the outermost (the outermost: its class name)."""
        root, inner = modules[-1], modules[0]
        if inner is root:
            return type(root).__name__
        names = self.names.get(id(root))
        if names is None:
            names = self.names[id(root)] = {id(m): n for n, m in root.named_modules()}
        return names.get(id(inner), type(inner).__name__)


# What a frame's file says of the op recorded under it, found once per file (a walk passes
# dozens of frames; a dict lookup each, on a string whose hash is kept, is what it costs):
# the user's line, an optimizer's, autograd's (backward()'s own ops), or a library's.
_USER, _OPTIMIZER, _BACKWARD, _LIBRARY = range(4)
_KINDS: dict[str, int] = {}
_KINDS_KEPT = 4096  # files (a notebook's cells are each a file of their own)


def _kind(name: str) -> int:
    if name.startswith(_OPTIM):
        kind = _OPTIMIZER
    elif name.startswith(_AUTOGRAD):
        kind = _BACKWARD
    elif name.startswith(_OURS) or name.startswith("<frozen"):
        kind = _LIBRARY
    else:
        kind = _USER
    if len(_KINDS) >= _KINDS_KEPT:
        _KINDS.clear()
    _KINDS[name] = kind
    return kind


def _optimizer(f) -> str | None:
    """The class of the optimizer whose method runs in frame ``f`` of torch.optim (None: not
    a method, or the base class's), by the code's qualified name: a frame's ``f_locals``
    would keep a snapshot of its locals alive (Python < 3.13), delaying their frees."""
    code = f.f_code
    if not code.co_argcount or code.co_varnames[0] != "self":
        return None
    qualname = getattr(code, "co_qualname", None)  # (Python 3.11+)
    name = qualname.split(".")[0] if qualname else type(f.f_locals.get("self")).__name__
    return None if name == "Optimizer" else name


def site_data(sites: list) -> list:
    """The plain data of a block's sites (one per entry; None for a free): what the
    ``hotpath.sites`` event carries."""
    out = []
    for s in sites:
        if s is None:
            out.append(None)
            continue
        file, line, module, phase, optimizer = s
        text = linecache.getline(file, line).strip() if file else ""
        source = f"{file}:{line}" if file else None
        out.append(
            {
                "source": source,
                "text": text,
                "module": module,
                "phase": phase,
                "optimizer": optimizer,
            }
        )
    return out


class Lines:
    """What the client says of the user's lines: a hot block's sites (once per block), and
    how many syncs and uploads each line made (the explorer's Source tab).

    Syncs and uploads are counted where a round trip or a copy happens anyway (a frame walk
    is a few µs beside tens): never on the recording path. Their counts are published with
    the client's counters, when they changed.
    """

    LIMIT = 4096  # distinct lines counted (the first ones)

    def __init__(self, log):
        self.log = log
        self.counts: dict[tuple[str, str], int] = {}
        self._sent = 0
        self._n = 0
        self.said: dict[str, list] = {}  # signature -> its sites, as said
        self.last: dict[str, tuple | None] = {}  # kind -> the user's line of its latest

    def sites(self, sig: str, sites: list) -> None:
        """Where a hot block's entries were recorded: the ``hotpath.sites`` event."""
        entries = self.said[sig] = site_data(sites)
        self.log.emit(ev.SITES, signature=sig, entries=entries)

    def count(self, kind: str, counters: dict) -> None:
        """One more of ``kind`` ("syncs" or "uploads"): in the client's ``counters`` and on
        the user's line making it."""
        counters[kind] += 1
        where = self.last[kind] = user_line(2)
        if where is None:
            return
        key = (kind, f"{where[0]}:{where[1]}")
        if key in self.counts or len(self.counts) < self.LIMIT:
            self.counts[key] = self.counts.get(key, 0) + 1
            self._n += 1

    def reset(self) -> None:
        """Count from zero (the event history was cleared). The blocks' sites are said again:
        a block's first run since says its form again (gt_core.observe.events.KNOWN), and
        its sites are found only once."""
        self.counts.clear()
        self._sent = self._n = 0
        for sig, entries in self.said.items():
            self.log.emit(ev.SITES, signature=sig, entries=entries)

    def publish(self, counters: dict) -> None:
        """The client's ``counters`` (a ``stats`` event), then the lines' counts if changed."""
        self.log.emit(ev.STATS, **counters)
        if self._n == self._sent:
            return
        self._sent = self._n
        out: dict[str, dict[str, int]] = {"syncs": {}, "uploads": {}}
        for (kind, source), n in self.counts.items():
            out[kind][source] = n
        self.log.emit(ev.CLIENT_LINES, **out)
