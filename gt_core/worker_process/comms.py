"""The collectives a worker group's rank runs: how many and how many bytes, by kind.

Every collective of torch.distributed, whoever calls it, reaches the process group through
one of the ``c10d::`` ops (``c10d::allreduce_``, ``c10d::_allgather_base_``, ...): gt's own
agreements (``dist.all_reduce``), DTensor's redistributions run op by op (functional
collectives, whose kernels call the process group), and the same collectives inside a
compiled block (aot_eager's graph or inductor's code call the functional collectives too).
A Python kernel registered at the ``BackendSelect`` key of each of those ops counts the call,
then runs the op below that key: BackendSelect is in every call's key set and is not
excluded inside a ``__torch_dispatch__`` (where DTensor runs its collectives, below
autograd), and tracing never reaches these ops (functional collectives on fake tensors stop
at their own fake kernels), so a call is counted once, where it runs, and only then. Its cost
is one Python call per collective; ops that are no collective pay nothing.

The bytes of a collective are those this rank puts in: an all-reduce's or a broadcast's
tensors, an all-gather's local part, a reduce-scatter's whole input.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["Comms", "install"]

# The c10d op (without its trailing underscore) -> its kind, as the report names it.
_KINDS = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather",
    "_allgather_base": "all_gather",
    "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "gather": "gather",
    "scatter": "scatter",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "send": "send",
    "recv": "recv",
    "recv_any_source": "recv",
    "barrier": "barrier",
}
# The argument holding what this rank puts in, by name (the first of these an op has).
_INPUTS = ("input_tensor", "input_tensors", "input_list", "inputs", "input", "tensors")


class Comms:
    """Collectives run in this process so far: ``{kind: [count, bytes]}``."""

    def __init__(self):
        self.totals: dict[str, list[int]] = {}
        self._lib = None

    def snapshot(self) -> dict[str, tuple[int, int]]:
        """The totals now, ``{kind: (count, bytes)}`` (a copy)."""
        return {k: (v[0], v[1]) for k, v in self.totals.items()}

    def count(self, kind: str, nbytes: int) -> None:
        t = self.totals.get(kind)
        if t is None:
            t = self.totals[kind] = [0, 0]
        t[0] += 1
        t[1] += nbytes


_comms: Comms | None = None
_lock = threading.Lock()


def install() -> Comms:
    """This process's counts, counting from the first call on (once per process)."""
    global _comms
    with _lock:
        if _comms is None:
            comms = Comms()
            comms._lib = _register(comms)
            _comms = comms
    return _comms


def _register(comms: Comms):
    import torch.distributed  # noqa: F401  (registers the c10d ops)

    lib = torch.library.Library("c10d", "IMPL")
    for name, kind in _KINDS.items():
        packet = getattr(torch.ops.c10d, name + "_", None) or getattr(torch.ops.c10d, name, None)
        if packet is None:  # (not in this torch)
            continue
        op = packet.default
        names = [a.name for a in op._schema.arguments]
        at = next((names.index(n) for n in _INPUTS if n in names), 0)
        lib.impl(op._schema.name.split("::")[1], _counting(comms, op, kind, at), "BackendSelect")
    return lib


_KEYS = {  # a device type -> the key of its kernel (where the call goes on, see _counting)
    t: torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, k))
    for t, k in (("cpu", "CPU"), ("cuda", "CUDA"), ("meta", "Meta"))
}
_OTHER = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)


def _counting(comms: Comms, op, kind: str, at: int):
    """The op's BackendSelect kernel: count the call, then go on to the kernel of the
    tensors' device (a redispatch: BackendSelect stays on for what that kernel makes, as
    an all-gather's output; excluding it would fail every factory op inside)."""

    from torch._subclasses.fake_tensor import FakeTensor

    def kernel(*args, **kwargs):
        x = args[at] if at < len(args) else None
        t = _first(x if x is not None else args)
        if t is None:
            return op.redispatch(_KEYS["cpu"], *args, **kwargs)
        if not (t.is_meta or isinstance(t, FakeTensor)):  # (meta, fake: a trace, nothing runs)
            comms.count(kind, _nbytes(x))
        return op.redispatch(_KEYS.get(t.device.type, _OTHER), *args, **kwargs)

    return kernel


def _first(x):
    """The first tensor in ``x`` (nested lists), or None."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (list, tuple)):
        for y in x:
            t = _first(y)
            if t is not None:
                return t
    return None


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, (list, tuple)):
        return sum(_nbytes(y) for y in x)
    return 0
