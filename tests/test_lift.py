"""Lifted scalars: each liftable op's tensor form equals the eager op bit for bit.

A block's floats that change every occurrence (a learning rate, a bias correction) become
0-d tensor inputs, and ``lift.lower`` writes the op that takes them in a tensor form. Eager
PyTorch is the oracle: for every float position ``float_positions`` accepts, the lowered
graph run on random tensors and a random float gives ``torch.equal`` results. A form that
rounds once more than the kernel (``a + b * s`` for add's fused alpha) is off by an ulp per
step, which an optimizer's steps grow past any tolerance.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx as fx
from hypothesis import given, settings
from hypothesis import strategies as st

from gt_core.stream import lift
from gt_core.stream.instructions import OP, Op, Ref

aten = torch.ops.aten
N = 3  # tensors per foreach list

# op -> the call to lift from: tensors as "a", "b", "c" (c positive: a divisor), foreach lists
# as ("a",) ..., floats as 0.5 (each float is lifted, one case per position).
_T, _L = "t", "l"
CASES = {
    **{
        getattr(aten, f"{n}{i}").Tensor: [((_T + "a", 0.5), {})]
        + ([((_T + "a", _T + "b"), {"alpha": 0.5})] if n in ("add", "sub") else [])
        for n in ("add", "sub", "mul", "div")
        for i in ("", "_")
    },
    **{
        getattr(aten, f"{n}{i}").default: [((_T + "a", _T + "b", _T + "c"), {"value": 0.5})]
        for n in ("addcdiv", "addcmul")
        for i in ("", "_")
    },
    aten.lerp.Scalar: [((_T + "a", _T + "b", 0.5), {})],
    aten.lerp_.Scalar: [((_T + "a", _T + "b", 0.5), {})],
    aten.pow.Scalar: [((0.5, _T + "c"), {})],
    aten.scalar_tensor.default: [((0.5,), {"dtype": torch.float32})],
    **{
        getattr(aten, f"_foreach_{n}{i}").Scalar: [((_L + "a", 0.5), {})]
        for n in ("add", "sub", "mul", "div")
        for i in ("", "_")
    },
    **{
        getattr(aten, f"_foreach_{n}{i}").ScalarList: [((_L + "a", [0.5] * N), {})]
        for n in ("add", "sub", "mul", "div")
        for i in ("", "_")
    },
    **{
        getattr(aten, f"_foreach_{n}{i}").List: [((_L + "a", _L + "b"), {"alpha": 0.5})]
        for n in ("add", "sub")
        for i in ("", "_")
    },
    **{
        getattr(aten, f"_foreach_{n}{i}").Scalar: [((_L + "a", _L + "b", _L + "c", 0.5), {})]
        for n in ("addcdiv", "addcmul")
        for i in ("", "_")
    },
    **{
        getattr(aten, f"_foreach_{n}{i}").ScalarList: [
            ((_L + "a", _L + "b", _L + "c", [0.5] * N), {})
        ]
        for n in ("addcdiv", "addcmul")
        for i in ("", "_")
    },
    aten._foreach_lerp.Scalar: [((_L + "a", _L + "b", 0.5), {})],
    aten._foreach_lerp_.Scalar: [((_L + "a", _L + "b", 0.5), {})],
}


def _liftable_ops() -> set:
    """Every op ``lift`` has a tensor form for (its tables), so a new one needs a case."""
    ops = lift._BINARY | lift._ADDC | set(lift._LERP) | set(lift._FOREACH_BINARY)
    ops |= set(lift._FOREACH_ADDC) | set(lift._FOREACH_LERP) | set(lift._FOREACH_ALPHA)
    return ops | {aten.pow.Scalar, aten.scalar_tensor.default}


def test_every_liftable_op_has_a_case():
    assert _liftable_ops() - set(CASES) == set()


def _instr(op, args, kwargs, dtype):
    """(the instruction with Refs, its tensors by id, a meta_of)."""
    tensors: dict[int, torch.Tensor] = {}

    def ref(name: str, k: int | None = None) -> Ref:
        i = len(tensors)
        tensors[i] = name if k is None else f"{name}{k}"
        return Ref(i)

    def conv(a):
        if type(a) is str and a.startswith(_T):
            return ref(a[1:])
        if type(a) is str and a.startswith(_L):
            return [ref(a[1:], k) for k in range(N)]
        return a

    ins = Op(OP, 0, tuple(conv(a) for a in args), {k: conv(v) for k, v in kwargs.items()}, ())
    meta = {i: torch.empty(0, dtype=dtype) for i in tensors}
    return ins, tensors, lambda i: meta.get(i)


def _cases():
    for op, calls in CASES.items():
        for n, (args, kwargs) in enumerate(calls):
            ins, _, meta_of = _instr(op, args, kwargs, torch.float32)
            for path in lift.float_positions(op, ins, meta_of):
                yield pytest.param(op, n, path, id=f"{op}-{n}-{'.'.join(map(str, path))}")


def test_every_case_lifts_something():
    lifted = {p.values[0] for p in _cases()}
    assert set(CASES) - lifted == set()


def _values(name: str, shape, dtype, gen) -> torch.Tensor:
    t = torch.randn(shape, dtype=dtype, generator=gen)
    return t.abs() + 0.5 if name.startswith("c") else t


@pytest.mark.parametrize("op,n,path", list(_cases()))
@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    value=st.floats(-10, 10, allow_nan=False, width=64).filter(lambda v: abs(v) > 1e-9),
    size=st.sampled_from([1, 7, 64, 1031]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**16),
)
def test_a_lifted_scalar_gives_the_eager_op_bit_for_bit(op, n, path, value, size, dtype, seed):
    args, kwargs = CASES[op][n]
    if op is aten.pow.Scalar:
        value = abs(value)  # (a negative base to a float power: NaN on both sides)
    if op is aten.scalar_tensor.default:
        kwargs = {"dtype": dtype}
    ins, names, meta_of = _instr(op, args, kwargs, dtype)
    gen = torch.Generator().manual_seed(seed)
    base = {name: _values(name, (size,), dtype, gen) for name in set(names.values())}
    args_v, kwargs_v = list(ins.args), dict(ins.kwargs)
    lift.set_at(args_v, kwargs_v, path, value)

    def real(a):
        if type(a) is Ref:
            return base[names[a.id]].clone()
        if type(a) is list and a and type(a[0]) is Ref:
            return [real(x) for x in a]
        return a

    want_args = [real(a) for a in args_v]
    want_kwargs = {k: real(v) for k, v in kwargs_v.items()}
    got_args = [real(a) for a in args_v]  # (clones: in-place ops write their own copies)
    want = op(*want_args, **want_kwargs)

    g = fx.Graph()
    placeholders = {}

    def node(a):
        if type(a) is torch.Tensor:
            placeholders[id(a)] = (g.placeholder(f"x{len(placeholders)}"), a)
            return placeholders[id(a)][0]
        if type(a) is list and a and type(a[0]) is torch.Tensor:
            return [node(x) for x in a]
        return a

    lowered_args = [node(a) for a in got_args]
    lowered_kwargs = dict(kwargs_v)
    s = g.placeholder("s")
    lift.set_at(lowered_args, lowered_kwargs, path, lift.Lifted(s))
    out = lift.lower(g, op, tuple(lowered_args), lowered_kwargs)
    g.output(out if out is not None else ())
    gm = fx.GraphModule(torch.nn.Module(), g)
    inputs = [t for _, t in placeholders.values()]
    scalar = torch.tensor(value, dtype=meta_of(0).dtype if meta_of(0) is not None else dtype)
    got = gm(*inputs, scalar)

    if out is None or op._schema.name.endswith("_"):  # in place: what the op wrote
        want, got = want_args, got_args
    _assert_equal(got, want)


def _assert_equal(got, want) -> None:
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        diff = (got.double() - want.double()).abs().max().item() if want.numel() else 0.0
        assert torch.equal(got, want), f"off by {diff:.3g}"
    elif isinstance(want, (list, tuple)):
        got = [x for x in got if isinstance(x, torch.Tensor)] if len(got) != len(want) else got
        for x, y in zip(got, want, strict=True):
            _assert_equal(x, y)
