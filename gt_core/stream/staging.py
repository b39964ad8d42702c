"""Tensors between the kernel and the worker at memory speed: shared-memory staging areas.

A tensor crosses as one copy into a named shared-memory segment and one copy out of it; the
pipe carries only a :class:`Staged` descriptor (segment, offset, dtype, shape, strides).

- Uploads (kernel → worker) go into a ring the client writes and the worker reads in stream
  order: the PUT naming the bytes is sent after they are written, and the worker copies them
  out when the PUT arrives, then publishes how far it has read (the ring's tail, the first 8
  bytes of the segment). The writer reuses space behind the tail; when the ring is full it
  asks its owner to make room (the client waits until the worker has read everything sent).
- Fetches (worker → kernel) go into the worker's download area, rewound for each answer: a
  request waits for its answer, so the client has copied the last one out before the next
  request is even sent.
- A tensor too big for the area grows it (a new segment; the reader closes the old one when
  the first descriptor of the new one arrives); one over ``ONE_OFF`` bytes gets a segment of
  its own, closed by the reader after its copy.
Segments are files in ``/dev/shm`` (mode 0600) named after the creating process; the reader
unlinks a name as soon as it has mapped it, the creator unlinks what was never read when it
closes, and :func:`sweep` removes those of processes that no longer exist.

A worker on another machine cannot map those segments: its connection carries the bytes
themselves (:class:`Inline`, made by :func:`inline`); :meth:`Reader.take` reads either kind, so
the worker's loop is the same for both, and the local path keeps its one copy each way.

Why not pickled tensors: multiprocessing's reducers move each tensor's storage into a shared
segment of its own and pass its file descriptor through a helper connection, milliseconds per
tensor, and a fetched tensor could alias memory the worker goes on writing.
"""

from __future__ import annotations

import ctypes
import itertools
import mmap
import os
import struct
import tempfile
from typing import NamedTuple

import torch

from gt_core.stream import storage_pool

__all__ = [
    "Staged",
    "Inline",
    "InlineWriter",
    "inline",
    "Writer",
    "Reader",
    "sweep",
    "layout",
    "ONE_OFF",
]

_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
_PREFIX = "gt-stage-"
_HEADER = 64  # the tail (8 bytes) in a cache line of its own; data starts aligned
_ALIGN = 64
ONE_OFF = 256 << 20  # a tensor over this many bytes travels in a segment of its own
_TAIL = struct.Struct("<q")
_names = itertools.count()
# Pages mapped at once, not one fault at a time as the copies first touch them (a fault is
# several µs on a virtual machine: a 16 MB ring would cost milliseconds on its first lap).
_FLAGS = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class Staged(NamedTuple):
    """Where a tensor's bytes wait: ``segment`` at ``offset``, laid out as ``shape``/``stride``.

    ``end``: the ring position just past these bytes (what the reader publishes as its tail
    once it has copied them), or -1 for a segment of its own, closed after its one copy.
    """

    segment: str
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple
    stride: tuple
    end: int


class Inline(NamedTuple):
    """A tensor's bytes carried in the message itself (a worker on another machine)."""

    data: bytes
    dtype: torch.dtype
    shape: tuple
    stride: tuple


def inline(t: torch.Tensor) -> Inline:
    """``t``'s bytes, dense (``layout(t)``'s strides), taken now: one copy."""
    stride, n = layout(t)
    if not _flat(t, stride):
        t = torch.empty_strided(t.shape, stride, dtype=t.dtype).copy_(t)
    data = ctypes.string_at(t.data_ptr(), n) if n else b""
    return Inline(data, t.dtype, tuple(t.shape), stride)


class InlineWriter:
    """A download area for a connection that carries bytes (the remote worker's answers)."""

    @staticmethod
    def stage(t: torch.Tensor) -> Inline:
        return inline(t)  # (a GPU tensor is copied into a dense host tensor there)

    def rewind(self) -> None: ...

    def close(self) -> None: ...


STAGED = (Staged, Inline)  # what a PUT or a tensor answer carries


def layout(t: torch.Tensor) -> tuple[tuple, int]:
    """(strides, bytes) of a dense copy of ``t``: its own strides where it is dense and
    non-overlapping (as ``clone`` keeps them), else contiguous ones."""
    if t.is_contiguous():
        stride = t.stride()
    else:
        stride = torch.empty_like(t, device="meta").stride()
    return tuple(stride), t.numel() * t.element_size()


def _flat(t: torch.Tensor, stride: tuple) -> bool:
    """Whether ``t``'s elements are the bytes from its data pointer on, laid out as a dense
    tensor of ``stride`` (``layout(t)``'s: where they equal ``t``'s own, ``t`` is dense)."""
    if t.device.type != "cpu" or t.is_conj() or t.is_neg():
        return False
    return t.stride() == stride


def _copy_in(seg: _Segment, s: Staged, t: torch.Tensor) -> None:
    """``t`` into ``seg`` where ``s`` says. One memcpy where it can be: torch's copy splits a
    large copy over its OpenMP threads, and the kernel and the worker each have a thread per
    core; a copy waits for a thread the other process holds, many times longer than one
    memcpy takes (README, "Benchmarks")."""
    if _flat(t, s.stride):
        ctypes.memmove(seg.base + s.offset, t.data_ptr(), s.nbytes)
    else:
        seg.view(s).copy_(t)


def _copy_out(src: int, nbytes: int, out: torch.Tensor) -> None:
    """``nbytes`` from address ``src`` into ``out`` (made with their layout).

    To another device the bytes go through host memory, pinned for a GPU, and on to the
    device asynchronously in the current stream's order (every later op on ``out`` comes
    after the copy): the host side returns after one memcpy. The pinned block returns to
    torch's caching host allocator, which hands it out again only once the copy has run.
    """
    if out.device.type == "cpu":
        ctypes.memmove(out.data_ptr(), src, nbytes)
        return
    pinned = out.device.type == "cuda"
    host = torch.empty_strided(out.shape, out.stride(), dtype=out.dtype, pin_memory=pinned)
    ctypes.memmove(host.data_ptr(), src, nbytes)
    out.copy_(host, non_blocking=pinned)


def _path(name: str) -> str:
    return os.path.join(_DIR or tempfile.gettempdir(), name)


class _Segment:
    """A named shared-memory file mapped here; ``bytes``: a uint8 tensor over all of it."""

    def __init__(self, name: str, size: int | None = None):
        self.name = name
        path = _path(name)
        if size is None:  # open one another process made, and take its name off the disk
            fd = os.open(path, os.O_RDWR)
            try:
                size = os.fstat(fd).st_size
                os.unlink(path)
                self.map = mmap.mmap(fd, size, flags=_FLAGS)
            finally:
                os.close(fd)
        else:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, size)
                self.map = mmap.mmap(fd, size, flags=_FLAGS)
            finally:
                os.close(fd)
        self.size = size
        self.bytes = torch.frombuffer(self.map, dtype=torch.uint8) if size else None
        self.base = self.bytes.data_ptr() if size else 0  # (the mapping's address)

    def view(self, s: Staged) -> torch.Tensor:
        """The tensor ``s`` describes, over this segment's memory (valid while it is open)."""
        raw = self.bytes[s.offset : s.offset + s.nbytes].view(s.dtype)
        return raw.as_strided(s.shape, s.stride)

    def close(self) -> None:
        self.bytes = None  # (the mapping cannot close while a tensor exports it)
        self.map.close()


def _new_name() -> str:
    return f"{_PREFIX}{os.getpid()}-{next(_names)}-{os.urandom(3).hex()}"


def _unlink(name: str) -> None:
    try:
        os.unlink(_path(name))
    except FileNotFoundError:
        pass


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 1).bit_length()


class Writer:
    """The writing side of a staging area (the client's uploads, the worker's fetches).

    ``stage(t)`` copies ``t`` in and returns its :class:`Staged`. With ``make_room`` (a ring),
    space is reused once the reader's tail has passed it, and ``make_room()`` is called when
    the ring is full (it must return once the reader has read everything staged so far);
    without it, the area is rewound by :meth:`rewind` (a download: one answer at a time).
    """

    def __init__(self, capacity: int, make_room=None):
        self.capacity = capacity  # bytes of data the area holds (it grows: see stage)
        self.make_room = make_room
        self.ring: _Segment | None = None
        self.head = 0  # bytes staged in the current ring since it was made
        self.made: set[str] = set()  # names made here that a reader may not have unlinked

    def stage(self, t: torch.Tensor) -> Staged:
        stride, n = layout(t)
        if n > ONE_OFF:
            seg = self._segment(n)
            try:
                s = Staged(seg.name, 0, n, t.dtype, tuple(t.shape), stride, -1)
                _copy_in(seg, s, t)
            finally:
                seg.close()
            return s
        size = (n + _ALIGN - 1) // _ALIGN * _ALIGN
        # A ring holds at least two of its largest tensor (one being read, one written);
        # a download area one.
        room = 2 * size if self.make_room is not None else size
        if self.ring is None or room > self.ring.size - _HEADER:
            self._grow(max(self.capacity, _pow2(room)))
        offset, end = self._place(size)
        s = Staged(self.ring.name, _HEADER + offset, n, t.dtype, tuple(t.shape), stride, end)
        if n:
            _copy_in(self.ring, s, t)
        return s

    def _place(self, size: int) -> tuple[int, int]:
        """(offset in the ring, position past it) for ``size`` bytes, waiting for room."""
        span = self.ring.size - _HEADER
        at = self.head % span
        start = self.head if at + size <= span else self.head + (span - at)  # wrap to 0
        if at and start == self.head and self.make_room is not None and self._tail() == self.head:
            # The reader has read everything: start over at 0, its tail with us (it writes
            # the tail only after reading what comes next). A batch a step then lands where
            # the last one did, still in the cache for both copies, where a ring walked
            # through streams every upload from memory.
            start = self.head + (span - at)
            _TAIL.pack_into(self.ring.map, 0, start)
        if start + size - self._tail() > span:
            if self.make_room is None:
                raise RuntimeError("gt: a staging area without a reader's tail is full")
            self.make_room()
            if start + size - self._tail() > span:
                raise RuntimeError(
                    "gt: the worker did not read the staging ring after a wait for everything "
                    "sent (its tail did not move)"
                )
        self.head = start + size
        return start % span, self.head

    def _tail(self) -> int:
        return _TAIL.unpack_from(self.ring.map, 0)[0]

    def rewind(self) -> None:
        """Start the area over (a download: the last answer has been read, or dropped)."""
        self.head = 0

    def _segment(self, size: int) -> _Segment:
        name = _new_name()
        seg = _Segment(name, size)
        self.made.add(name)
        return seg

    def _grow(self, capacity: int) -> None:
        # The reader keeps the old ring mapped (or its name, until it maps it) for what is
        # still staged there, and lets it go at the first descriptor of the new one.
        if self.ring is not None:
            self.ring.close()
        self.capacity = capacity
        self.ring = self._segment(_HEADER + capacity)
        self.head = 0

    def close(self) -> None:
        """Let go of the area; names no reader took are removed."""
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        for name in self.made:
            _unlink(name)
        self.made.clear()


class Reader:
    """The reading side: copies staged tensors out, publishes the ring's tail."""

    def __init__(self, device: torch.device | str = "cpu", reuse: int = 0):
        self.device = torch.device(device)
        self.ring: _Segment | None = None
        # CPU tensors of 1 MB and more take storage freed by earlier ones (``reuse`` bytes
        # at most): see gt_core.stream.storage_pool.
        self.pool = storage_pool.Pool(reuse)

    def take(self, s: Staged, device: torch.device | None = None) -> torch.Tensor:
        """A tensor holding ``s``'s bytes, on ``device`` (default: the reader's); its place in
        the area is free again once this returns."""
        device = self.device if device is None else device
        if type(s) is Inline:  # (the bytes object lives in ``s`` through the copy)
            src = ctypes.cast(ctypes.c_char_p(s.data), ctypes.c_void_p).value
            return self._copy(src, len(s.data), s, device)
        if s.end < 0:
            seg = _Segment(s.segment)
            try:
                return self._copy(seg.base + s.offset, s.nbytes, s, device)
            finally:
                seg.close()
        ring = self.ring
        if ring is None or ring.name != s.segment:
            if ring is not None:
                ring.close()  # the writer moved on: nothing more will be read from it
            ring = self.ring = _Segment(s.segment)
        out = self._copy(ring.base + s.offset, s.nbytes, s, device)
        _TAIL.pack_into(ring.map, 0, s.end)
        return out

    def _copy(self, src: int, nbytes: int, s, device: torch.device) -> torch.Tensor:
        """A tensor of ``s``'s layout on ``device`` holding the ``nbytes`` at ``src``."""
        if device.type == "cpu":
            out = self.pool.empty(s.shape, s.stride, s.dtype, nbytes)
        else:
            out = torch.empty_strided(s.shape, s.stride, dtype=s.dtype, device=device)
        if nbytes:
            _copy_out(src, nbytes, out)
        return out

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        self.pool.clear()


def sweep() -> int:
    """Remove segments left by processes that no longer exist; how many were removed."""
    if _DIR is None:
        return 0
    gone = 0
    for name in os.listdir(_DIR):
        if not name.startswith(_PREFIX):
            continue
        try:
            pid = int(name[len(_PREFIX) :].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            _unlink(name)
            gone += 1
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
