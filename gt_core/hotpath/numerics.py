"""The numerical check of a compiled block: its first compiled run against its eager graph.

A compiler can be wrong without an error (a layout it picked, a rewrite that drops an
argument). gt's rule is that a plan can make a step faster, never wrong, so before a compiled
block's results are used, its eager graph runs on copies of the same inputs (every distinct
storage copied once, so inputs that alias stay aliased), the random generators set back
before each run, and every output and every input (a block writes some in place) are
compared. A difference beyond the rule below reverts the block, naming the value and the
difference; the eager run's values are the ones kept.

The rule. Two float32 programs that order a sum differently differ, and an ill-conditioned
step (a near-zero gradient, Adam's division by its root) can make that difference large, so
"close to eager" alone cannot tell rounding from a wrong computation. Where the eager graph
also runs in float64 on the same inputs (the oracle), the compiled value fails only if it is
further from the oracle than ``MULTIPLIER`` times eager's own distance to it, plus a floor
of ``FLOOR`` (relative to the oracle's largest magnitude, and one unit in the last place of
1.0 absolute). Where float64 cannot run the graph (an op that needs one dtype), the compiled
value is compared with eager's directly, with ``TOLERANCE``.

The oracle is float64 throughout (``Wide``): a lower floating dtype an op of the graph asks
for (autocast's bfloat16 casts, a float32 factory) is float64 there. Kept, those casts would
round the oracle as eager rounds, and a compiler that keeps more precision than eager between
two fused ops (inductor elides a downcast-upcast pair) would look wrong by bfloat16's rounding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "TOLERANCE",
    "MULTIPLIER",
    "Verdict",
    "Copies",
    "Wide",
    "compare",
    "rng_state",
    "set_rng_state",
    "same_rng",
]

# Max-norm relative difference per dtype allowed without a float64 oracle.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 4e-3}
_DEFAULT = 1e-4
MULTIPLIER = 3.0  # compiled's distance to the float64 oracle over eager's, at most
FLOOR = 1e-5  # relative to the oracle's largest magnitude: differences below it pass
_UPCAST = frozenset((torch.float32, torch.bfloat16, torch.float16))


class Verdict(NamedTuple):
    """The worst value found: where (``what``), its difference, and the bound it met."""

    ok: bool
    what: str | None
    diff: float  # compiled's max |difference| (to the oracle where there is one, else to eager)
    bound: float  # the largest difference the rule allowed there

    def words(self) -> str:
        return (
            f"compiled result differs from eager at {self.what}: max |difference| "
            f"{self.diff:.3g}, where rounding explains at most {self.bound:.3g}"
        )


class Copies:
    """Copies of a block's inputs that alias each other as the inputs do: every distinct
    storage copied once, each input a view of its storage's copy (in float64 with
    ``upcast``: floating storages converted). An empty storage shares nothing: empty
    tensors all have address 0 (autocast's empty bfloat16 and float32 inputs are two).
    ``restore()`` writes the copies' values back into the inputs' storages (not after
    ``upcast``)."""

    def __init__(self, inputs: list, upcast: bool = False):
        storages: dict = {}
        self.tensors = []
        for x in inputs:
            if not isinstance(x, torch.Tensor):
                self.tensors.append(x)
                continue
            spec = getattr(x, "_spec", None)  # a DTensor: its part on this rank is copied
            if spec is not None:
                x = x._local_tensor
            st = x.untyped_storage()
            key = (st.data_ptr(), x.device, st.nbytes()) if st.nbytes() else len(self.tensors)
            if key not in storages:
                storages[key] = (st, _whole(st, x.dtype, upcast))
            base = storages[key][1]
            if base.dtype != (torch.float64 if upcast and x.dtype in _UPCAST else x.dtype):
                raise TypeError("inputs of several dtypes share one storage")
            copy = base.as_strided(x.size(), x.stride(), x.storage_offset())
            self.tensors.append(copy if spec is None else _rewrap(copy, spec))
        self._storages = [(real, copy.untyped_storage()) for real, copy in storages.values()]

    def restore(self) -> None:
        for real, copy in self._storages:
            real.copy_(copy)


class Wide(TorchDispatchMode):
    """While the oracle runs: an op asked for a floating dtype narrower than float64 (a
    complex one narrower than complex128) makes float64 (complex128) instead. A view of
    another dtype's bits (``view.dtype``) is kept: it reinterprets, it does not round."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        d = kwargs.get("dtype")
        if isinstance(d, torch.dtype) and func not in _BITS:
            wide = torch.complex128 if d.is_complex else torch.float64
            if (d.is_floating_point or d.is_complex) and d != wide:
                kwargs = {**kwargs, "dtype": wide}
        return func(*args, **kwargs)


_BITS = (torch.ops.aten.view.dtype,)


def _rewrap(local: torch.Tensor, spec):
    """A DTensor laid out as ``spec`` whose part on this rank is ``local``."""
    from torch.distributed.tensor import DTensor

    return DTensor.from_local(
        local, spec.mesh, spec.placements, run_check=False, shape=spec.shape, stride=spec.stride
    )


def _parts(got, want, ref):
    """Each rank's parts of DTensors laid out alike (each rank checks its part; a worker
    group agrees on the verdict), else the whole values (every rank compares the same)."""
    values = (got, want, ref)
    specs = [getattr(x, "_spec", None) for x in values]
    if not any(specs):
        return values
    alike = specs[0] is not None and specs[1] is not None
    alike = alike and all(s is None or s.placements == specs[0].placements for s in specs)
    if alike and (ref is None or specs[2] is not None):
        return tuple(
            x if s is None else x._local_tensor for x, s in zip(values, specs, strict=True)
        )
    return tuple(x if s is None else x.full_tensor() for x, s in zip(values, specs, strict=True))


def _whole(storage, dtype, upcast: bool) -> torch.Tensor:
    """A 1-d tensor over a copy of the whole ``storage`` read as ``dtype``."""
    n = storage.nbytes() // dtype.itemsize if dtype.itemsize else 0
    t = torch.empty(0, dtype=dtype, device=storage.device).set_(storage.clone(), 0, (n,), (1,))
    return t.double() if upcast and dtype in _UPCAST else t


def compare(pairs) -> Verdict:
    """The verdict over ``(what, compiled, eager, float64 oracle or None)``: the first value
    that fails, else the one nearest its bound (non-tensors skipped)."""
    worst = Verdict(True, None, 0.0, 0.0)
    for what, got, want, ref in pairs:
        if not isinstance(want, torch.Tensor) or not isinstance(got, torch.Tensor):
            continue
        v = _one(what, *_parts(got, want, ref))
        if not v.ok:
            return v
        if _ratio(v) > _ratio(worst):
            worst = v
    return worst


def _ratio(v: Verdict) -> float:
    return v.diff / v.bound if v.bound > 0 else 0.0


@torch.no_grad()
def _one(what: str, got: torch.Tensor, want: torch.Tensor, ref) -> Verdict:
    inf = float("inf")
    if got.shape != want.shape or got.dtype != want.dtype:
        where = f"{what} ({tuple(got.shape)} {got.dtype}, eager {tuple(want.shape)} {want.dtype})"
        return Verdict(False, where, inf, 0.0)
    if want.numel() == 0:
        return Verdict(True, what, 0.0, 0.0)
    if not (want.is_floating_point() or want.is_complex()):
        same = bool(torch.equal(got, want))
        return Verdict(same, f"{what} ({want.dtype}, compared exactly)", 0.0 if same else inf, 0.0)
    g, w = got.detach().double(), want.detach().double()
    nan = w.isnan()
    if not torch.equal(g.isnan(), nan):
        return Verdict(False, f"{what} (NaN where eager has none, or the reverse)", inf, 0.0)
    special = nan | w.isinf()
    if not torch.equal(g[special].nan_to_num(), w[special].nan_to_num()):
        return Verdict(False, f"{what} (an infinity differs)", inf, 0.0)
    g, w = g.masked_fill(special, 0), w.masked_fill(special, 0)
    ulp = torch.finfo(want.dtype).eps
    if ref is not None and isinstance(ref, torch.Tensor) and ref.shape == want.shape:
        r = ref.detach().double().masked_fill(special, 0)
        scale = r.abs().max().item()
        bound = MULTIPLIER * (w - r).abs().max().item() + FLOOR * scale + ulp
        diff = (g - r).abs().max().item()
    else:
        scale = w.abs().max().item()
        bound = TOLERANCE.get(want.dtype, _DEFAULT) * scale + ulp
        diff = (g - w).abs().max().item()
    return Verdict(diff <= bound, what, diff, bound)


def rng_state(device: torch.device):
    """The random generators' state a block run may draw from (CPU, and ``device``'s)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def same_rng(a, b) -> bool:
    """Whether two ``rng_state`` results are the same state."""
    return all(
        (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


def set_rng_state(device: torch.device, state) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)
