"""What a capture changes in torch while it runs, and puts back when the last one ends:
``torch.manual_seed`` (it seeds the worker too), torch.optim's capturable devices, the
kernel's intra-op threads, storage sharing (host tensors sent to other processes), and a
DataLoader's batches from tensors in memory. (The cyclic collector: ``collector``.)
"""

from __future__ import annotations

import sys

import torch
import torch.optim.optimizer as _torch_optimizer

from gt_core.client.recording.mode import made_on_host
from gt_core.client.recording.proxy import is_remote
from gt_core.client.recording.uploads import upload
from gt_core.client.session import LOCK
from gt_core.diagnostics.stance import in_worker
from gt_core.observe import events as ev

__all__ = [
    "patch_seed",
    "patch_default_dtype",
    "unpatch_default_dtype",
    "unpatch_seed",
    "patch_capturable",
    "patch_threads",
    "unpatch_threads",
    "patch_sharing",
    "patch_loader",
]

# torch.manual_seed as it was before the first capture; the kernel's intra-op threads then,
# and the count set for the capture (None: not changed)
_saved: dict = {"seed": None, "rng": None, "threads": None, "set": None}


def patch_threads() -> None:
    """The kernel's torch ops on plain tensors use one thread while a worker process computes.

    Inside a capture the kernel's own tensor work is the data path (a DataLoader's indexing
    and collate, copies into the upload ring) while the worker runs the steps beside it, its
    threads one per core. An intra-op parallel op in the kernel then waits for a thread the
    worker holds, hundreds of times longer than the op itself (README, "Benchmarks").
    """
    n = torch.get_num_threads()
    if n > 1:
        _saved["threads"], _saved["set"] = n, 1
        torch.set_num_threads(1)


def unpatch_threads() -> None:
    n, _saved["threads"] = _saved["threads"], None
    if n is not None and torch.get_num_threads() == _saved["set"]:  # (unless the user set it)
        torch.set_num_threads(n)


def patch_seed(session_here) -> None:
    """The global generator, called by a thread inside a capture (``session_here()``: that
    thread's capture's session, or None), is the worker's, where eager's stream goes on:
    torch.manual_seed seeds the worker too; torch.get_rng_state reads the worker's state (a
    sync) and torch.set_rng_state sets it there too, in the stream's order. The kernel's own
    state is taken up only where a capture begins and ends, so within one it is stale:
    torch.utils.checkpoint and torch.random.fork_rng save it and put it back, and the
    recomputed dropout masks were other than the forward's."""
    _saved["seed"] = seed = torch.manual_seed
    _saved["rng"] = get, put = torch.get_rng_state, torch.set_rng_state

    def ours():
        s = session_here()
        # Not worker code that runs in this process (the in-process worker's compiler
        # seeds its own things), not threads outside a capture.
        return s if s is not None and not in_worker.active and not s.closed else None

    def manual_seed(n):
        s = ours()
        if s is not None:
            s.mirror.seed(int(n))
        return seed(n)

    def get_rng_state():
        s = ours()
        if s is None:
            return get()
        state = s.mirror.fetch_rng_state()
        s.mirror.forget_rng_state()  # (draws recorded after this read move the worker on)
        return state

    def set_rng_state(new_state):
        s = ours()
        if s is not None:
            s.mirror.send_rng_state(new_state)
        return put(new_state)

    torch.manual_seed = torch.random.manual_seed = manual_seed
    torch.get_rng_state = torch.random.get_rng_state = get_rng_state
    torch.set_rng_state = torch.random.set_rng_state = set_rng_state


def patch_default_dtype(session_here) -> None:
    """torch.set_default_dtype, called by a thread inside a capture, sets the worker's too,
    in stream order (the worker makes the capture's factories and promotes integer tensors
    with Python floats: a spawned worker kept torch's float32 and gave float32 values under a
    float64 dtype)."""
    _saved["dtype"] = put = torch.set_default_dtype

    def set_default_dtype(d):
        s = session_here()
        if (
            s is None
            or in_worker.active
            or s.closed
            or not isinstance(d, torch.dtype)
            or not d.is_floating_point
            or d == torch.get_default_dtype()
        ):
            return put(d)  # (torch's own checks and errors)
        # The worker's first: an in-process worker shares this one, and what was recorded
        # before runs under the old dtype (the request waits for it).
        s.mirror.send_default_dtype(d)
        put(d)

    torch.set_default_dtype = set_default_dtype


def unpatch_default_dtype() -> None:
    put, _saved["dtype"] = _saved.get("dtype"), None
    if put is not None:
        torch.set_default_dtype = put


def unpatch_seed() -> None:
    seed, _saved["seed"] = _saved["seed"], None
    if seed is not None:
        torch.manual_seed = torch.random.manual_seed = seed
    rng, _saved["rng"] = _saved.get("rng"), None
    if rng is not None:
        torch.get_rng_state = torch.random.get_rng_state = rng[0]
        torch.set_rng_state = torch.random.set_rng_state = rng[1]


def _capturable_devices(supports_xla: bool = True) -> list[str]:
    """torch.optim's accelerators for capturable=True, and the CPU: inside a capture, tensors
    live on the worker, and a capturable optimizer keeps its step and bias corrections as
    tensors there (no .item(), no Python float that changes every step: what gt_core.jit
    needs to replay Adam)."""
    return [*_ORIGINAL_CAPTURABLE(supports_xla), "cpu"]


def _optim_modules() -> list:
    # (a copy: list(items()) allocates per item, and a collection it triggers may run a
    # finalizer that imports, changing sys.modules mid-iteration)
    return [
        m
        for name, m in sys.modules.copy().items()
        if name.startswith("torch.optim.") and hasattr(m, "_get_capturable_supported_devices")
    ]


def patch_capturable(on: bool) -> None:
    for m in _optim_modules():
        m._get_capturable_supported_devices = _capturable_devices if on else _ORIGINAL_CAPTURABLE


_ORIGINAL_CAPTURABLE = _torch_optimizer._get_capturable_supported_devices


# torch.multiprocessing moves a host tensor's storage into shared memory before sending it to
# another process (a DataLoader's spawned workers get the dataset so). Those methods make and
# fill a new storage through aten ops (empty, set_, copy_): inside a capture the empty became a
# worker tensor, and the dataset's storage was swapped for zeros.
_SHARING = ("share_memory_", "_share_fd_cpu_", "_share_filename_cpu_")
_ORIGINAL_SHARING = {name: getattr(torch.UntypedStorage, name) for name in _SHARING}


def _plain(method):
    from torch.utils._python_dispatch import _disable_current_modes

    def run(self, *args, **kwargs):
        with _disable_current_modes():
            return method(self, *args, **kwargs)

    run.__name__, run.__doc__ = method.__name__, method.__doc__
    return run


def patch_sharing(on: bool) -> None:
    """Host storages move to shared memory as without gt (no capture mode) while ``on``."""
    for name, method in _ORIGINAL_SHARING.items():
        setattr(torch.UntypedStorage, name, _plain(method) if on else method)


def _fetch_plainly(fetch, session_here):
    """A DataLoader's fetch over a TensorDataset with the default collate, run without the
    capture mode: the mode's Python dispatch costs more than each of a batch's small indexing
    ops does (README, "Benchmarks"). It is only
    indexing and stacking: host tensors give host batches (uploaded when a step uses them),
    worker tensors are still recorded (their own dispatch), and nothing draws random numbers,
    whose order on the worker must stay eager's. Any other dataset (map-style or iterable:
    this wraps both fetchers) is fetched in the capture mode with the tensors it makes from
    nothing on the host (made_on_host): its own code may draw, and its draws from the global
    generator stay the worker's.

    A batch is one indexing op per tensor with the batch's indices (see _rows), the same
    tensor as stacking its rows one by one. Where the dataset holds worker tensors (made
    inside a capture) those rows were a ``select`` per row, each with another integer every
    step, which no hot path can hold, so every step ran op by op."""
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils.data import TensorDataset
    from torch.utils.data._utils.collate import default_collate, default_convert

    def run(self, possibly_batched_index):
        if type(self.dataset) is TensorDataset and self.collate_fn in (
            default_collate,
            default_convert,
        ):
            with _disable_current_modes():
                if self.collate_fn is default_collate and _batched(self, possibly_batched_index):
                    batch = _rows(self.dataset.tensors, possibly_batched_index)
                    if batch is not None:
                        return batch
                return fetch(self, possibly_batched_index)
        s = session_here()
        if s is None:
            return fetch(self, possibly_batched_index)
        before = s.counters["ops"]
        with made_on_host() as made:
            batch = fetch(self, possibly_batched_index)
        if _batched(self, possibly_batched_index):
            rows, ops = len(possibly_batched_index), s.counters["ops"] - before
            _say_rows(s, self.dataset, rows, ops, made.draws)
        return batch

    return run


def _say_rows(session, dataset, rows: int, ops: int, draws: int) -> None:
    """A batch of ``dataset`` recorded ``ops`` ops on the worker for ``rows`` rows (``draws``
    of them draws from the global generator): at one op a row or more, each step builds its
    batch op by op (rows of worker tensors indexed one at a time, with another number every
    step, or rows drawn on the worker: no hot path holds them), and the report says so once
    per dataset class (gt_core.observe.feeding)."""
    said = (ev.DATA_ROWS, type(dataset).__qualname__)
    if ops < rows or said in session.said:
        return
    session.said.add(said)
    session.log.emit(ev.DATA_ROWS, dataset=said[1], rows=rows, ops=ops, draws=draws)


def _rows(tensors: tuple, index: list) -> list | None:
    """Rows ``index`` of each tensor in one indexing op each, as default_collate stacks them
    (a list; None: leave it to the fetch). Worker tensors are indexed on the worker, the
    indices uploaded once and held here for every tensor's indexing (an upload nothing holds
    goes up again at its next use). Host tensors are indexed here where both ways give the
    same dense tensor (contiguous, no lazy conjugate or negative bit): a batch of 64 rows was
    64 ``__getitem__`` calls and a stack, 0.2-0.6 ms of the kernel's every step."""
    at = torch.tensor(index, dtype=torch.long)
    first = next((t for t in tensors if is_remote(t)), None)
    if first is None:
        if all(t.is_contiguous() and not t.is_conj() and not t.is_neg() for t in tensors):
            return [t[at] for t in tensors]
        return None
    with LOCK:
        on_worker = upload(type(first), first.gt_session, at, cache=False)
    return [t[on_worker] if is_remote(t) else t[at] for t in tensors]


def _batched(fetcher, index) -> bool:
    """Whether ``index`` is a batch's list of row numbers (auto-collation, plain ints)."""
    return (
        fetcher.auto_collation
        and type(index) is list
        and len(index) > 0
        and all(type(i) is int for i in index)
    )


def _batches_go_up_together(next_batch):
    """A DataLoader iterator's ``__next__`` whose batches' host tensors are uploaded together
    (gt_core.client.recording.uploads.batch), whichever of them a step uses first.

    A batch from the loader's processes is unpickled here without the capture mode: it is
    host data (rebuilding each tensor made an ``empty`` on the worker, a stray op in every
    step's block), and nothing there draws random numbers."""
    from torch.utils._python_dispatch import _disable_current_modes
    from torch.utils._pytree import tree_leaves
    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    from gt_core.client.recording.uploads import batch

    def run(self):
        if isinstance(self, _MultiProcessingDataLoaderIter):
            with _disable_current_modes():
                data = next_batch(self)
        else:
            data = next_batch(self)
        batch(
            [
                t
                for t in tree_leaves(data)
                if type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided
            ]
        )
        return data

    return run


def _seeded_on_host(init):
    """A DataLoader iterator's ``__init__`` that draws its base seed on the host where the
    loader has a generator of its own: the draw (``random_(generator=...).item()``, once an
    epoch) is eager's on the user's generator either way, and run here it waits for no step
    in flight on the worker. (A loader drawing from the global generator keeps its draw on
    the worker, whose generator is eager's.)"""
    from torch.utils._python_dispatch import _disable_current_modes

    def run(self, loader, *args, **kwargs):
        if getattr(loader, "generator", None) is None:
            return init(self, loader, *args, **kwargs)
        with _disable_current_modes():
            return init(self, loader, *args, **kwargs)

    return run


def patch_loader(on: bool, session_here=None) -> None:
    """While ``on``: batches made on the host as without gt (see _fetch_plainly), each
    batch's host tensors uploaded together (see _batches_go_up_together), and a seeded
    loader's epochs begun on the host (see _seeded_on_host).
    ``session_here()``: the calling thread's capture's session, or None."""
    from torch.utils.data import dataloader
    from torch.utils.data._utils import fetch

    cls = fetch._MapDatasetFetcher
    original = _saved.setdefault("fetch", cls.fetch)
    cls.fetch = _fetch_plainly(original, session_here) if on else original
    cls = fetch._IterableDatasetFetcher  # (never a TensorDataset, nor a batch of row numbers)
    original = _saved.setdefault("fetch_iterable", cls.fetch)
    cls.fetch = _fetch_plainly(original, session_here) if on else original
    it = dataloader._BaseDataLoaderIter
    original = _saved.setdefault("next_batch", it.__next__)
    it.__next__ = _batches_go_up_together(original) if on else original
    original = _saved.setdefault("loader_iter", it.__init__)
    it.__init__ = _seeded_on_host(original) if on else original
