"""A compiled block's lifted scalars as it takes them: 0-d tensors, made once, rewritten."""

from __future__ import annotations

import torch

__all__ = ["ScalarInputs"]


class ScalarInputs:
    """The 0-d tensors a compiled block's lifted scalars (an optimizer's learning rate, its
    bias corrections, per parameter) are passed as.

    On the CPU each block's are made once and written in place before each run, through a
    NumPy view of each tensor's memory (the number's bits as ``torch.tensor`` would round
    them, without a dispatch): an optimizer's hundreds of scalars a step made fresh cost the
    worker a sixth of a settled BERT step. Writing in place is right only while nothing a run
    returns shares memory with them. Lowering never returns a lifted scalar nor a view of one
    (``scalar_tensor`` becomes a clone), and each block's first run is checked: where an
    output does share, the block gets fresh tensors from then on. On another device, a kernel
    of the last run may still read a tensor when the next write comes: fresh tensors there.
    """

    def __init__(self, device: torch.device):
        self.cpu = device.type == "cpu"
        self.device = device
        self._held: dict[str, tuple[list, list] | None] = {}  # block -> tensors, views
        self._checked: set[str] = set()

    def of(self, sig: str, values, dtypes, fresh: bool = False) -> list:
        """The tensors holding ``values`` (of ``dtypes``) for a run of block ``sig``;
        ``fresh``: made anew (a worker group's sharded run wraps its inputs as distributed
        tensors, which may keep them past the run)."""
        if not dtypes:
            return []
        held = self._held.get(sig, ()) if self.cpu and not fresh else None
        if held == ():
            held = self._held[sig] = self._allocate(dtypes)
        if held is None:
            dev = self.device
            return [torch.tensor(v, dtype=dt, device=dev) for v, dt in zip(values, dtypes)]  # noqa: B905
        tensors, views = held
        for t, a, v in zip(tensors, views, values, strict=True):
            if a is not None:
                a[()] = v
            else:
                t.fill_(v)  # (a dtype NumPy has no view of: bfloat16)
        return tensors

    def ran(self, sig: str, outs) -> None:
        """After a run of ``sig`` (its outputs ``outs``): the first time, where an output
        shares memory with its scalars, fresh tensors from then on."""
        if sig in self._checked:
            return
        self._checked.add(sig)
        held = self._held.get(sig)
        if not held:
            return
        mine = {t.untyped_storage().data_ptr() for t in held[0]}
        if any(o.untyped_storage().data_ptr() in mine for o in _tensors(outs)):
            self._held[sig] = None

    @staticmethod
    def _allocate(dtypes) -> tuple[list, list]:
        tensors = [torch.zeros((), dtype=dt) for dt in dtypes]
        views = []
        for t in tensors:
            try:
                views.append(t.numpy())
            except TypeError:
                views.append(None)
        return tensors, views


def _tensors(outs):
    for o in outs if isinstance(outs, (list, tuple)) else (outs,):
        if isinstance(o, torch.Tensor):
            yield o
        elif isinstance(o, (list, tuple)):
            yield from _tensors(o)
