"""Inductor's on-disk cache after a compile cut short: find the damaged files, evict them, and
compile again.

Inductor links each C++ kernel straight into its cache directory (``TORCHINDUCTOR_CACHE_DIR``),
and a later compile of the same kernel, in any process, skips the build when that file exists.
The linker creates the file first and writes it last, so a compile killed while it links (gt
ends its compile process's group, C++ builds included, when the worker stops or the kernel
restarts) leaves an empty or truncated ``.so`` (or ``.o``) there, and every later compile of
that kernel fails to load it ("file too short", "invalid ELF header") until it is removed.

So a compile (or a load) that fails naming files in inductor's cache that are not whole ELF
files removes them and runs once more; :func:`evictions` collects what was removed, for the
compile's event. Only files under the cache directory are ever removed, and only files that
fail the ELF check: a failure for another reason is raised as it was.
"""

from __future__ import annotations

import contextlib
import os
import re
import struct
import threading

__all__ = ["retrying", "damaged_files", "whole_elf", "evictions", "record"]

# A compile killed mid-link leaves one damaged file per C++ build it had running (inductor's
# compile_threads at most); a retry fails at the first of them still there, so each evicts at
# least one. Past the last attempt the failure is raised: what was evicted stays evicted, and
# the next compile goes on from there.
_ATTEMPTS = 8
_SHT_NOBITS = 8  # a section that takes no room in the file (.bss)

_local = threading.local()


def retrying(fn):
    """``fn()``; where it fails naming damaged files of inductor's cache, evict them and call
    it again (each retry evicts something new, or the failure is raised)."""
    for attempt in range(_ATTEMPTS):
        try:
            return fn()
        except Exception as exc:
            evicted = (
                [f for f in damaged_files(exc) if _evict(f)] if attempt < _ATTEMPTS - 1 else []
            )
            if not evicted:
                raise
            _note(evicted, exc)


def damaged_files(exc: BaseException) -> list[str]:
    """The files in inductor's cache that ``exc`` (or an exception it chains) names and that
    are not whole ELF files, in the order named."""
    root = _cache_root()
    if root is None:
        return []
    pattern = re.compile(re.escape(root) + r"/[^\s'\":]+\.s?o\b")
    out: list[str] = []
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for path in pattern.findall(str(e)):
            if path not in out and os.path.isfile(path) and not whole_elf(path):
                out.append(path)
        e = e.__cause__ or e.__context__
    return out


def whole_elf(path: str) -> bool:
    """Whether ``path`` is an ELF file whose header, header tables, sections and loaded
    segments all lie within it (one that cannot be read counts as whole: it is left alone)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return True
    if len(data) < 16 or data[:4] != b"\x7fELF" or data[4] not in (1, 2) or data[5] not in (1, 2):
        return False
    wide, order = data[4] == 2, "<" if data[5] == 1 else ">"
    header = order + ("HHIQQQIHHHHHH" if wide else "HHIIIIIHHHHHH")
    if len(data) < 16 + struct.calcsize(header):
        return False
    _, _, _, _, phoff, shoff, _, _, phsize, phnum, shsize, shnum, _ = struct.unpack_from(
        header, data, 16
    )
    size = len(data)
    if phoff + phnum * phsize > size or shoff + shnum * shsize > size:
        return False
    program = order + ("IIQQQQ" if wide else "IIIII")  # up to p_filesz
    for k in range(phnum):
        fields = struct.unpack_from(program, data, phoff + k * phsize)
        offset, filesz = (fields[2], fields[5]) if wide else (fields[1], fields[4])
        if offset + filesz > size:
            return False
    section = order + ("IIQQQQ" if wide else "IIIIII")  # up to sh_size
    for k in range(shnum):
        _, kind, _, _, offset, length = struct.unpack_from(section, data, shoff + k * shsize)
        if kind != _SHT_NOBITS and offset + length > size:
            return False
    return True


@contextlib.contextmanager
def evictions():
    """Yields a list that collects the evictions made for this thread's compiles meanwhile,
    each ``{"files": [...], "reason": "..."}`` (also those :func:`record` passes on)."""
    outer = getattr(_local, "into", None)
    _local.into = out = []
    try:
        yield out
    finally:
        _local.into = outer
        if outer is not None:
            outer.extend(out)


def record(evicted) -> None:
    """Add evictions made elsewhere for this thread's compile (the compile process's)."""
    into = getattr(_local, "into", None)
    if into is not None and evicted:
        into.extend(evicted)


def _cache_root() -> str | None:
    """Inductor's cache directory: inductor sets ``TORCHINDUCTOR_CACHE_DIR`` (to its default
    where it was unset) when it first uses its cache, so any path it named comes from it."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return os.path.abspath(root).rstrip(os.sep) if root else None


def _evict(path: str) -> bool:
    """Remove a damaged file, under the lock inductor builds it under (a build of it in
    another process finishes first, and then it is whole: kept). Whether it was removed."""
    from filelock import FileLock  # torch's own dependency, as its cache locks use it

    key = os.path.basename(path).split(".", 1)[0]
    lock = os.path.join(_cache_root() or os.path.dirname(path), "locks", key + ".lock")
    try:
        locked = os.path.isdir(os.path.dirname(lock))
        with FileLock(lock, timeout=60) if locked else contextlib.nullcontext():
            if whole_elf(path):
                return False
            os.remove(path)
    except (OSError, TimeoutError):
        return False
    return True


def _note(files: list[str], exc: BaseException) -> None:
    text = f"{type(exc).__name__}: {exc}".strip()
    reason = (
        f"inductor's cache held {len(files)} damaged file(s) left by a compile cut short "
        f"({text[:300]}); removed, and compiled again"
    )
    record([{"files": files, "reason": reason}])
