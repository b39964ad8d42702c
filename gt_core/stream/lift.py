"""Lifted scalars: Python floats that change every occurrence become tensor inputs of a block.

Adam's bias corrections and learning-rate schedules put a new Python float into a few ops
of every training step. Baked into the graph, each step would be a new block; lifted, the
block's canonical form names them ``%s0, %s1…`` (like inputs), the compiled function takes
them as 0-d tensors, and one compile serves every step.

Only positions whose op has a tensor form are lifted (``liftable``); ``lower`` writes such
an op in the graph with the 0-d tensor in place of the float, in the order of operations of
the eager kernel (``addcdiv``: self + value * t1 / t2), so results match eager.
"""

from __future__ import annotations

import torch
import torch.fx as fx

from gt_core.stream.canonical import Mismatch, Namer
from gt_core.stream.instructions import OP, Ref

__all__ = [
    "Scalar",
    "LiftNamer",
    "set_at",
    "lift_positions",
    "float_positions",
    "lower",
    "has_scalars",
]

_aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float64)


class Scalar:
    """The k-th lifted scalar of a block, in place of a Python float in its canonical form."""

    __slots__ = ("k",)

    def __init__(self, k: int):
        self.k = k

    def __repr__(self) -> str:
        return f"%s{self.k}"

    def __reduce__(self):
        return (Scalar, (self.k,))

    def __eq__(self, other) -> bool:
        return type(other) is Scalar and other.k == self.k

    def __hash__(self) -> int:
        return hash(("Scalar", self.k))


class LiftNamer(Namer):
    """A Namer that replaces the floats at ``lift[entry][path]`` by Scalars and keeps their values."""

    __slots__ = ("lift", "pos", "scalars", "dtypes")

    def __init__(self, meta_of, lift: dict):
        super().__init__(meta_of)
        self.lift = lift  # entry position -> {path: dtype}
        self.pos = 0
        self.scalars: list[float] = []
        self.dtypes: list = []

    def entry(self, ins, op_name):
        paths = self.lift.get(self.pos)
        self.pos += 1
        if paths and ins.code == OP:
            args, kwargs = list(ins.args), dict(ins.kwargs)
            for path, dtype in paths.items():
                value = _get(args, kwargs, path)
                if type(value) is not float and type(value) is not int:
                    raise Mismatch(f"expected a number at {path}, got {value!r}")
                set_at(args, kwargs, path, Scalar(len(self.scalars)))
                self.scalars.append(float(value))
                self.dtypes.append(dtype)
            ins = ins._replace(args=tuple(args), kwargs=kwargs)
        return super().entry(ins, op_name)


def has_scalars(lift: dict) -> bool:
    return any(lift.values())


def _get(args, kwargs, path):
    """The value at ``path``; an instruction that has none there does not fit the entry
    (another op, or the same op with fewer arguments) and is a Mismatch, not an error."""
    try:
        a = args[path[0]] if type(path[0]) is int else kwargs[path[0]]
        for i in path[1:]:
            a = a[i]
    except (IndexError, KeyError, TypeError):
        raise Mismatch(f"no argument at {path}") from None
    return a


def set_at(args, kwargs, path, value) -> None:
    """``value`` at ``path`` of an op's arguments (nested lists copied, not written)."""
    if len(path) == 1:
        if type(path[0]) is int:
            args[path[0]] = value
        else:
            kwargs[path[0]] = value
        return
    container = args if type(path[0]) is int else kwargs
    inner = list(container[path[0]])
    container[path[0]] = inner
    for i in path[1:-1]:  # nested lists do not occur in aten scalar arguments; keep it general
        inner[i] = list(inner[i])
        inner = inner[i]
    inner[path[-1]] = value


# -- which positions can be lifted --------------------------------------------------------
def _binary(name):
    p = getattr(_aten, name)
    return {p.Tensor, getattr(_aten, name + "_").Tensor}


_BINARY = _binary("add") | _binary("sub") | _binary("mul") | _binary("div")
_ADDC = {
    _aten.addcdiv.default,
    _aten.addcdiv_.default,
    _aten.addcmul.default,
    _aten.addcmul_.default,
}
_LERP = {_aten.lerp.Scalar: _aten.lerp.Tensor, _aten.lerp_.Scalar: _aten.lerp_.Tensor}
_FOREACH_BINARY = {}
for _n in ("add", "sub", "mul", "div"):
    for _inplace in ("", "_"):
        _base = getattr(_aten, _n + _inplace).Tensor
        for _ov in ("Scalar", "ScalarList"):
            _FOREACH_BINARY[getattr(getattr(_aten, f"_foreach_{_n}{_inplace}"), _ov)] = _base
_FOREACH_ADDC = {}
for _n in ("addcdiv", "addcmul"):
    for _inplace in ("", "_"):
        _base = getattr(_aten, _n + _inplace).default
        for _ov in ("Scalar", "ScalarList"):
            _FOREACH_ADDC[getattr(getattr(_aten, f"_foreach_{_n}{_inplace}"), _ov)] = _base
_FOREACH_LERP = {
    _aten._foreach_lerp.Scalar: _aten.lerp.Tensor,
    _aten._foreach_lerp_.Scalar: _aten.lerp_.Tensor,
}
_FOREACH_ALPHA = {
    _aten._foreach_add.List: _aten.add.Tensor,
    _aten._foreach_add_.List: _aten.add_.Tensor,
    _aten._foreach_sub.List: _aten.sub.Tensor,
    _aten._foreach_sub_.List: _aten.sub_.Tensor,
}


def _operand(op, args, kwargs, path):
    """The tensor a lifted scalar at ``path`` combines with (its dtype is the scalar's), or None."""
    head = path[0]
    if op in _BINARY:
        if path == (1,):
            return args[0]
        if path == ("alpha",):
            return args[1]
    elif op in _ADDC and path == ("value",):
        return args[1]
    elif op in _LERP and path == (2,):
        return args[1]
    elif op in _FOREACH_BINARY and head == 1:
        if len(path) == 2:
            return args[0][path[1]]
        if len(path) == 1 and op._overloadname == "Scalar":
            return args[0][0]
    elif op in _FOREACH_ADDC and head == 3:
        if len(path) == 2:
            return args[1][path[1]]
        if len(path) == 1 and op._overloadname == "Scalar":
            return args[1][0]
    elif op in _FOREACH_LERP and path == (2,):
        return args[1][0]
    elif op in _FOREACH_ALPHA and path == ("alpha",):
        return args[1][0]
    elif op is _aten.scalar_tensor.default and path == (0,):
        return kwargs.get("dtype") or torch.get_default_dtype()
    elif op is _aten.pow.Scalar and path == (0,):  # (Adam's beta ** step, a scheduled beta)
        return args[1]
    return None


def lift_positions(op, a, b, meta_of) -> dict | None:
    """{path: dtype} where instructions ``a`` and ``b`` differ only in liftable floats; else None."""
    diffs: list = []
    if not _float_diffs(a.args, b.args, (), diffs):
        return None
    if set(a.kwargs) != set(b.kwargs):
        return None
    for k, v in a.kwargs.items():
        if not _float_diffs(v, b.kwargs[k], (k,), diffs):
            return None
    out = {}
    for path in diffs:
        dtype = _dtype(op, a, path, meta_of)
        if dtype is None:
            return None
        out[path] = dtype
    return out or None


def float_positions(op, ins, meta_of) -> dict:
    """{path: dtype} of every float of instruction ``ins`` that could be lifted (the
    positions ``lift_positions`` would accept, were they to change)."""
    paths: list = []
    _float_paths(ins.args, (), paths)
    for k, v in ins.kwargs.items():
        _float_paths(v, (k,), paths)
    out = {}
    for path in paths:
        dtype = _dtype(op, ins, path, meta_of)
        if dtype is not None:
            out[path] = dtype
    return out


def _float_paths(x, path, out) -> None:
    if type(x) is float:
        out.append(path)
    elif type(x) is list or type(x) is tuple:
        for i, v in enumerate(x):
            _float_paths(v, (*path, i), out)


def _dtype(op, ins, path, meta_of):
    """The dtype a float at ``path`` of ``ins`` would be lifted as (None: not liftable)."""
    operand = _operand(op, ins.args, ins.kwargs, path)
    if isinstance(operand, torch.dtype):
        dtype = operand
    elif type(operand) is Ref:
        meta = meta_of(operand.id)
        dtype = None if meta is None else meta.dtype
    else:
        dtype = None
    return dtype if dtype in _FLOATS else None


def _float_diffs(x, y, path, out) -> bool:
    """Walk two arguments; collect paths of differing floats; False on any other difference."""
    tx, ty = type(x), type(y)
    if tx is Ref and ty is Ref:
        return True
    if (
        (tx is float or tx is int)
        and (ty is float or ty is int)
        and tx is not bool
        and ty is not bool
    ):
        if x != y or tx is not ty:
            if tx is not float or ty is not float:
                return False  # an int that changes is a shape or a count: not lifted
            out.append(path)
        return True
    if (tx is list or tx is tuple) and tx is ty:
        if len(x) != len(y):
            return False
        return all(
            _float_diffs(u, v, (*path, i), out) for i, (u, v) in enumerate(zip(x, y, strict=True))
        )
    return tx is ty and x == y


# -- graph lowering -----------------------------------------------------------------------
def _has_scalar(a) -> bool:
    if isinstance(a, fx.Node):
        return False
    if isinstance(a, (list, tuple)):
        return any(_has_scalar(x) for x in a)
    return isinstance(a, Lifted)


class Lifted:
    """A lifted scalar's placeholder node, marked so lowering can find it among arguments."""

    __slots__ = ("node",)

    def __init__(self, node: fx.Node):
        self.node = node


def _n(a):
    return a.node if isinstance(a, Lifted) else a


def lower(g: fx.Graph, op, args: tuple, kwargs: dict):
    """Emit ``op(*args, **kwargs)`` where some floats are lifted; returns the node (or list)."""
    if not _has_scalar(args) and not _has_scalar(tuple(kwargs.values())):
        return g.call_function(op, args, kwargs)
    call = g.call_function
    if op in _BINARY:
        kw = dict(kwargs)
        alpha = kw.pop("alpha", 1)
        if isinstance(alpha, Lifted) and isinstance(args[1], fx.Node):
            return _scaled_add(g, op, args[0], args[1], alpha.node)
        if isinstance(alpha, Lifted):  # (both lifted: no fused form; seen in no optimizer)
            return call(op, (args[0], call(_aten.mul.Tensor, (_n(args[1]), alpha.node))), kw)
        if alpha != 1:
            kw["alpha"] = alpha  # (a lifted 0-d other, a number alpha: the op as it is)
        return call(op, (args[0], _n(args[1])), kw)
    if op in _ADDC:
        return _addc(g, op, args[0], args[1], args[2], kwargs.get("value", 1))
    if op in _LERP:
        return call(_LERP[op], (args[0], args[1], _n(args[2])))
    if op is _aten.scalar_tensor.default:
        return call(_aten.clone.default, (_n(args[0]),))
    if op is _aten.pow.Scalar:  # (eager: the base a number of the exponent's dtype)
        return call(_aten.pow.Tensor_Tensor, (_n(args[0]), args[1]))
    if op in _FOREACH_BINARY:
        base, scalars = _FOREACH_BINARY[op], args[1]
        each = scalars if isinstance(scalars, (list, tuple)) else [scalars] * len(args[0])
        outs = [call(base, (x, _n(s))) for x, s in zip(args[0], each, strict=True)]
        return None if op._schema.name.endswith("_") else outs
    if op in _FOREACH_ADDC:
        base, scalars = _FOREACH_ADDC[op], args[3]
        each = scalars if isinstance(scalars, (list, tuple)) else [scalars] * len(args[0])
        outs = [
            _addc(g, base, x, a, b, s)
            for x, a, b, s in zip(args[0], args[1], args[2], each, strict=True)
        ]
        return None if op._schema.name.endswith("_") else outs
    if op in _FOREACH_LERP:
        outs = [
            call(_FOREACH_LERP[op], (x, e, _n(args[2])))
            for x, e in zip(args[0], args[1], strict=True)
        ]
        return None if op._schema.name.endswith("_") else outs
    if op in _FOREACH_ALPHA:
        base, alpha = _FOREACH_ALPHA[op], _n(kwargs["alpha"])
        outs = [_scaled_add(g, base, x, y, alpha) for x, y in zip(args[0], args[1], strict=True)]
        return None if op._schema.name.endswith("_") else outs
    raise Mismatch(f"{op} has a lifted scalar but no tensor form")


# Each tensor form below gives the eager kernel's result bit for bit (tests/test_lift.py):
# CPU kernels fuse a multiply-add (add's alpha, addcmul's value) where ``a + b * s`` rounds
# twice, and a block's drift from eager grew over an optimizer's steps into a wrong number.
def _scaled_add(g: fx.Graph, op, a, b, s):
    """``add/sub(a, b, alpha=s)`` with ``s`` a 0-d tensor node: ``addcmul(a, b, ±s)``, the
    same fused ``a + s * b``."""
    name = op._schema.name
    if "sub" in name:
        s = g.call_function(_aten.neg.default, (s,))
    fused = _aten.addcmul_.default if name.endswith("_") else _aten.addcmul.default
    return g.call_function(fused, (a, b, s))


def _addc(g: fx.Graph, op, self_, t1, t2, value):
    # addcdiv: the eager kernel computes self + value * t1 / t2, left to right; addcmul fuses
    # self + (value * t1) * t2, so its tensor form is addcmul(self, t1 * value, t2).
    call = g.call_function
    scaled = (
        call(_aten.mul.Tensor, (t1, _n(value))) if value != 1 or isinstance(value, Lifted) else t1
    )
    inplace = op._schema.name.endswith("_")
    if "addcmul" in op._schema.name:
        return call(
            _aten.addcmul_.default if inplace else _aten.addcmul.default, (self_, scaled, t2)
        )
    term = call(_aten.div.Tensor, (scaled, t2))
    return call(_aten.add_.Tensor if inplace else _aten.add.Tensor, (self_, term))


__all__ += ["Lifted"]
