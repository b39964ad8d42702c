"""Random ops draw into memory in its order: a compiled graph gives them eager's layouts.

A random fill (``bernoulli_``, ``uniform_``, ``normal_``...) writes its draws in the memory
order of the tensor it fills, and eager gives that tensor the strides of the one it is made
like: ``empty_like(x)`` and ``rand_like(x)`` keep a permuted ``x``'s strides. A compiler is
free to lay a buffer out otherwise: inductor (torch 2.13) functionalizes ``bernoulli_`` into
a fill of a fresh copy it lays out contiguously, so a dropout of a permuted activation
(``nn.MultiheadAttention`` with ``batch_first``) draws the same numbers into other places.
The mask is not eager's, the result differs by far more than rounding, and the numerical
check reverts the block (``fallback_random`` alone keeps the generator's numbers, not where
they land).

``pin_random_layouts`` makes every random fill of a graph ``gt::random_fill``: an op the
compiler cannot see into, which makes a tensor with the strides eager gave the filled one
(from a fake run of the graph on the example inputs) and fills it with eager's own kernel.
A fresh buffer (``empty_like``) is replaced by it; another tensor (an input, a view) has it
copied in, which keeps each draw at its element. A ``*_like`` random op is the fill eager's
kernel does (``rand_like(x)`` is ``empty_like(x).uniform_(0, 1)`` in ATen). The op is tagged
``nondeterministic_seeded``: two alike calls are two draws, never one shared. And each takes
the one before it as an input it never reads: nothing else orders them (a fill reads no
tensor), and a compiler that ran them in another order would give each the other's draws.
"""

from __future__ import annotations

import torch
import torch.fx as fx

__all__ = ["pin_random_layouts", "random_fill"]

_aten = torch.ops.aten


def _draw(t: torch.Tensor, kind: str, a: float, b: float, p):
    if kind == "bernoulli":
        return t.bernoulli_(a if p is None else p)
    if kind in ("uniform", "normal", "cauchy", "log_normal"):
        return getattr(t, kind + "_")(a, b)
    if kind in ("exponential", "geometric"):
        return getattr(t, kind + "_")(a)
    if kind == "random_to":
        return t.random_(int(a))
    if kind == "random_from":
        return t.random_(int(a), int(b))
    return t.random_()


# Defined with torch.library's lower-level API, not ``custom_op``: a compiled block calls it
# on every run, once per random fill, and ``custom_op``'s Python layers around the kernel (an
# autograd wrapper, a Dynamo guard, an aliasing check of the outputs) cost several times the
# kernel itself on a small tensor (benchmarks: docs/benchmarks.md). The worker runs without
# autograd, and the op makes a fresh tensor: those layers guard nothing here.
_LIB = torch.library.Library("gt", "FRAGMENT")
_LIB.define(
    "random_fill(SymInt[] size, SymInt[] stride, ScalarType dtype, Device device, str kind, "
    "float a, float b, Tensor? p, Tensor? after) -> Tensor",
    tags=(torch.Tag.nondeterministic_seeded,),
)


def _random_fill(size, stride, dtype, device, kind, a, b, p, after):
    """A tensor of ``size`` and ``stride`` filled as eager's random fill ``kind`` fills it
    (``a``, ``b``: its numbers; ``p``: bernoulli's tensor of probabilities; ``after``: the
    graph's random op before it, never read: it orders the draws)."""
    return _draw(torch.empty_strided(size, stride, dtype=dtype, device=device), kind, a, b, p)


_LIB.impl("random_fill", _random_fill, "CompositeExplicitAutograd")


@torch.library.register_fake("gt::random_fill", lib=_LIB)
def _(size, stride, dtype, device, kind, a, b, p, after):
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


random_fill = torch.ops.gt.random_fill.default


def _numbers(node: fx.Node) -> list:
    """A random op's arguments after its first, defaults filled in from its schema."""
    schema = node.target._schema.arguments[1:]
    out = []
    for i, arg in enumerate(schema):
        if arg.kwarg_only:
            break
        out.append(
            node.args[1 + i]
            if 1 + i < len(node.args)
            else node.kwargs.get(arg.name, arg.default_value)
        )
    return out


# The random ops pinned, each as the fill it is: (kind, how many of its numbers are a, b).
# In-place fills draw by the filled tensor's layout, not its values; the ``*_like`` makers are
# their fills in ATen (rand_like(x): empty_like(x).uniform_(0, 1)).
_FILLS = {
    _aten.bernoulli_.float: ("bernoulli", 1),
    _aten.bernoulli_.Tensor: ("bernoulli", 0),  # (its tensor of probabilities: p)
    _aten.uniform_.default: ("uniform", 2),
    _aten.normal_.default: ("normal", 2),
    _aten.exponential_.default: ("exponential", 1),
    _aten.geometric_.default: ("geometric", 1),
    _aten.cauchy_.default: ("cauchy", 2),
    _aten.log_normal_.default: ("log_normal", 2),
    _aten.random_.default: ("random", 0),
    _aten.random_.to: ("random_to", 1),
}
_LIKE = {
    _aten.rand_like.default: ("uniform", (0.0, 1.0)),
    _aten.randn_like.default: ("normal", (0.0, 1.0)),
    _aten.randint_like.default: ("random_to", None),  # (its high: its first number)
    _aten.bernoulli.default: ("bernoulli", None),  # (its input: the probabilities)
    # (the factories' layout is contiguous in eager and compiled alike: they are made so
    # that they keep their place in the order of the draws)
    _aten.rand.default: ("uniform", (0.0, 1.0)),
    _aten.randn.default: ("normal", (0.0, 1.0)),
    _aten.randint.default: ("random_to", None),
    _aten.randint.low: ("random_from", None),
}


def _how(node: fx.Node):
    """(kind, a, b, p) of a random op's node; None where a number is not a plain one (a
    lifted tensor) or it names a generator."""
    if node.kwargs.get("generator") is not None:
        return None
    nums = _numbers(node)
    if node.target is _aten.bernoulli.default:
        return ("bernoulli", 0.0, 0.0, node.args[0])
    if node.target is _aten.randint.default:  # randint(high, size)
        return ("random_to", float(node.args[0]), 0.0, None)
    if node.target is _aten.randint.low:  # randint(low, high, size)
        return ("random_from", float(node.args[0]), float(node.args[1]), None)
    if node.target in _LIKE:
        kind, ab = _LIKE[node.target]
        ab = ab or (nums[0], 0.0)
        return (kind, float(ab[0]), float(ab[1]), None)
    kind, n = _FILLS[node.target]
    if node.target is _aten.bernoulli_.Tensor:
        return (kind, 0.0, 0.0, nums[0])
    ab = nums[:n]
    if any(type(v) not in (int, float) for v in ab):
        return None
    ab = [float(v) for v in ab] + [0.0, 0.0]
    return (kind, ab[0], ab[1], None)


# Fresh buffers whose values nothing reads before a fill: replaced, not copied into.
_FRESH = frozenset(
    {_aten.empty_like.default, _aten.empty.memory_format, _aten.empty_strided.default}
)
# (randint_like with a low bound and random_(from, to) are random_.from, which an FX graph
# cannot name in its code: they stay as they are, and where the compiled layout is not
# eager's, the numerical check reverts the block.)


def _random_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and (n.target in _FILLS or n.target in _LIKE)
    ]


def _eager_values(gm: fx.GraphModule, example_inputs: list) -> None:
    """Each node's ``meta["val"]``: a fake tensor with the strides eager gives it."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in example_inputs]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*fakes)


def pin_random_layouts(gm: fx.GraphModule, example_inputs: list) -> int:
    """Make each random op of ``gm`` draw where eager does (see the module); returns how many
    were pinned. For static shapes: the layouts are the examples'."""
    nodes = [(n, how) for n in _random_nodes(gm) if (how := _how(n)) is not None]
    if not nodes:
        return 0
    try:
        _eager_values(gm, example_inputs)
    except Exception:
        # (an op without a fake kernel: the graph compiles as it is, and where its masks are
        # not eager's, the numerical check reverts it, naming the difference)
        return 0
    g, n_pinned, before = gm.graph, 0, None
    for node, (kind, a, b, p) in nodes:
        target = node.args[0] if node.target in _FILLS else node
        val = target.meta.get("val") if isinstance(target, fx.Node) else None
        if val is None or any(
            st == 0 and s > 1 for s, st in zip(val.shape, val.stride(), strict=True)
        ):
            continue  # (an expanded tensor: a fill of it is an error eager raises itself)
        with g.inserting_before(node):
            made = g.call_function(
                torch.ops.gt.random_fill.default,
                (list(val.shape), list(val.stride()), val.dtype, val.device, kind, a, b, p, before),
            )
        before = made
        if node.target in _LIKE:
            node.replace_all_uses_with(made)
        elif target.op == "call_function" and target.target in _FRESH and _only_filled(target):
            node.replace_all_uses_with(made)
            target.replace_all_uses_with(made)
            g.erase_node(node)
            g.erase_node(target)
            n_pinned += 1
            continue
        else:
            with g.inserting_after(made):
                copied = g.call_function(_aten.copy_.default, (target, made))
            node.replace_all_uses_with(copied)
        g.erase_node(node)
        n_pinned += 1
    gm.recompile()
    return n_pinned


def _only_filled(buf: fx.Node) -> bool:
    """Whether nothing reads fresh buffer ``buf`` before the first random fill of it."""
    node = buf.next
    while node not in buf.users:
        node = node.next
    return node.target in _FILLS and node.args[0] is buf
