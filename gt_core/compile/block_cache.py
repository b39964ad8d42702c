"""Compiled blocks kept on disk: the same block compiled again is loaded, not compiled.

Inductor's own caches make a second compile of a graph cheaper, not free: the compile
process still traces the block through AOTAutograd and looks its pieces up (3-4 s for a
900-op training step on two cores), and meanwhile the step runs eagerly. A notebook runs the
same cell again and again, and each run starts a fresh worker; so the compile process's
artifact (what the worker loads, ~15 ms) is kept under a key of everything that makes it:
the job (the block's canonical form, its ops, inputs' metadata and sharing, its lifted
scalars, the device), the mode's options, torch's version, inductor's settings in the
environment, and gt's own code that builds and rewrites the graph. A hit is loaded as the
compile process's artifact would be, and checked as it would be (the block's first compiled
run against its eager graph, hotpath.checking).

Kept beside inductor's cache (``torch._inductor`` cache dir, ``gt_blocks``), so clearing
that clears this; ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` turns both off.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

__all__ = ["KEPT", "key", "lookup", "keep", "forget", "enabled"]

KEPT = "kept"  # a compile's cache use (beside inductor's hit, miss, bypass): loaded from here

# gt's code that decides what a block compiles to (the graph built and rewritten).
_CODE = ("compile", "stream")


def enabled() -> bool:
    return os.environ.get("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "0") not in ("1", "true")


def _folder() -> Path:
    """Inside inductor's cache dir as it is now (``TORCHINDUCTOR_CACHE_DIR`` may change in a
    process): an artifact kept beside one cache and loaded beside another would find none of
    its kernels there and build them in the worker, outside the compile process."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return Path(cache_dir()) / "gt_blocks"


_ENV = ("TORCHINDUCTOR_", "TORCHDYNAMO_", "TORCH_COMPILE_")  # (inductor's own settings)


def _fingerprint() -> str:
    """torch's version, the environment's inductor settings as they are now (the compile
    process inherits them) and a hash of gt's graph-building code."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV))
    env = [kv for kv in env if kv[0] != "TORCHINDUCTOR_CACHE_DIR"]
    return hashlib.sha256((_code_hash() + repr(env)).encode()).hexdigest()


@functools.cache
def _code_hash() -> str:
    """torch's version and gt's graph-building code (neither changes in a process)."""
    import torch

    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256(torch.__version__.encode())
    for sub in _CODE:
        for f in sorted((root / sub).glob("*.py")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def key(job: tuple, metas: list, options: dict) -> str | None:
    """The cache key of a compile job; None where it cannot be made (a value that does not
    pickle): such a job is compiled every time."""
    try:
        blob = pickle.dumps((job, metas, sorted(options.items())), protocol=4)
    except Exception:
        return None
    return hashlib.sha256(_fingerprint().encode() + blob).hexdigest()


def lookup(k: str | None, path: str) -> dict | None:
    """Copy the artifact kept under ``k`` to ``path``; its info (code, phases), or None."""
    if k is None or not enabled():
        return None
    art, meta = _folder() / f"{k}.bin", _folder() / f"{k}.json"
    try:
        info = json.loads(meta.read_text())
        shutil.copyfile(art, path)
    except (OSError, ValueError):
        return None
    return info


def keep(k: str | None, path: str, info: dict) -> None:
    """Keep the artifact at ``path`` (and its info) under ``k``; quietly not where the disk
    refuses (the block is compiled again next time)."""
    if k is None or not enabled():
        return
    folder = _folder()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f"{k}.{os.getpid()}.tmp"
        shutil.copyfile(path, tmp)
        os.replace(tmp, folder / f"{k}.bin")
        (folder / f"{k}.{os.getpid()}.jtmp").write_text(json.dumps(info, default=str))
        os.replace(folder / f"{k}.{os.getpid()}.jtmp", folder / f"{k}.json")
    except OSError:
        pass


def forget(k: str | None) -> None:
    """Remove what is kept under ``k`` (an artifact that would not load)."""
    if k is None:
        return
    for ext in ("bin", "json"):
        (_folder() / f"{k}.{ext}").unlink(missing_ok=True)
