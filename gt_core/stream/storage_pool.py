"""Memory for the tensors that cross the staging areas, reused once nothing holds it.

A fresh large tensor is a fresh mapping whose pages fault in one at a time as the copy into
it first touches them: on a virtual machine that costs several times the copy itself (a 64 MB
upload spent most of its time there, and eager's own ``clone()`` of 64 MB pays it too). A
loop fed by a DataLoader moves tensors of the same few sizes every step, and each dies a step
or two after it arrived: a storage of that exact size whose last user is gone can take the
next one, its pages already mapped.

The rule that keeps this invisible: a storage is handed out again only when the pool's own
reference is the only one left (no tensor, view or storage object elsewhere holds it), and a
reused tensor is indistinguishable from a fresh one (same size of storage, offset 0, the
layout asked for). Small tensors are left to the allocator (its free lists already reuse
them), and the pool holds at most ``limit`` bytes, letting go of the least recently used free
storages first.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["Pool", "MIN_BYTES"]

MIN_BYTES = 1 << 20  # smaller tensors come from the allocator's free lists


_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)  # (private: None = never reuse)


def _unused(slots: list, i: int) -> bool:
    """Whether the pool's reference is the only one to ``slots[i]``'s memory.

    Two kinds of holder: tensors and views hold the storage in C++ (its use count: 1 is the
    pool's storage object), and Python code holding ``t.untyped_storage()`` holds the very
    object the pool holds (torch keeps one Python object per storage): its reference count
    is then above the pool's list, the local name below and getrefcount's argument.
    """
    storage = slots[i]
    return sys.getrefcount(storage) <= 3 and _USE_COUNT(storage._cdata) == 1


class Pool:
    """Storages by exact size in bytes; :meth:`empty` takes a free one or makes one."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = 0  # bytes of the storages in the pool, in use or free
        self.sizes: dict[int, list[torch.UntypedStorage]] = {}  # least recently used first

    def empty(self, shape: tuple, stride: tuple, dtype: torch.dtype, nbytes: int) -> torch.Tensor:
        """An uninitialised CPU tensor of this dense layout (``nbytes``: its storage's size)."""
        if nbytes < MIN_BYTES:
            return torch.empty_strided(shape, stride, dtype=dtype)
        storage = self._free(nbytes) or self._new(nbytes)
        if storage is None:
            return torch.empty_strided(shape, stride, dtype=dtype)
        return torch.empty(0, dtype=dtype).set_(storage, 0, shape, stride)

    def _free(self, nbytes: int) -> torch.UntypedStorage | None:
        slots = self.sizes.pop(nbytes, None)
        if slots is None:
            return None
        self.sizes[nbytes] = slots  # now the most recently used size
        for i in range(len(slots)):
            if _unused(slots, i) and slots[i].nbytes() == nbytes:  # (not resized since)
                return slots[i]
        return None

    def _new(self, nbytes: int) -> torch.UntypedStorage | None:
        if _USE_COUNT is None or nbytes > self.limit:
            return None
        if self.held + nbytes > self.limit:
            self._evict(self.held + nbytes - self.limit)
            if self.held + nbytes > self.limit:
                return None  # the pool is full of storages still in use
        storage = torch.UntypedStorage(nbytes)
        self.sizes.setdefault(nbytes, []).append(storage)
        self.held += nbytes
        return storage

    def _evict(self, need: int) -> None:
        """Let go of free storages, least recently used sizes first, until ``need`` bytes went."""
        for nbytes in list(self.sizes):
            slots = self.sizes[nbytes]
            for i in reversed(range(len(slots))):
                if need > 0 and _unused(slots, i):
                    del slots[i]
                    self.held -= nbytes
                    need -= nbytes
            if not slots:
                del self.sizes[nbytes]
            if need <= 0:
                return

    def clear(self) -> None:
        """Let go of every storage (those still in use live on with their tensors)."""
        self.sizes.clear()
        self.held = 0
