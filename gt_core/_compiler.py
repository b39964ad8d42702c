"""Compiler: a hot block's canonical form → an FX graph of aten calls → a compiled function.

The graph's inputs are the block's external values (in canonical order), its outputs the
values produced and not freed inside it; in-place mutations of inputs stay in the graph
(AOTAutograd functionalizes them and writes them back). The backend is called directly on
the aten-level graph, as torch.compile does after Dynamo: the graph is already traced, and
our signature is its guard, so there is nothing for Dynamo to add.
"""

from __future__ import annotations

import operator
import time

import torch
import torch.fx as fx

from ._lift import Scalar, _Lifted, lower
from .signature import Canonical

__all__ = ["build_graph", "compile_block", "rewrite_alpha"]

_aten = torch.ops.aten
# Inductor on torch 2.13 (CPU) drops `alpha` in add(x, mm(a, b), alpha=...): see FINDINGS.md.
_ALPHA_OPS = {
    _aten.add.Tensor: _aten.add.Tensor,
    _aten.add_.Tensor: _aten.add_.Tensor,
    _aten.sub.Tensor: _aten.sub.Tensor,
    _aten.sub_.Tensor: _aten.sub_.Tensor,
}
_FOREACH_ALPHA = {
    _aten._foreach_add.List,
    _aten._foreach_add_.List,
    _aten._foreach_sub.List,
    _aten._foreach_sub_.List,
}


def build_graph(
    canon: Canonical, ops: dict, out_paths: dict, fix_alpha: bool = True, n_scalars: int = 0
) -> fx.GraphModule:
    """The block as an FX GraphModule; ``out_paths[k]`` locates op k's outputs in its result.

    Its inputs are the block's values, then its ``n_scalars`` lifted scalars (0-d tensors).
    """
    g = fx.Graph()
    env: dict[tuple, fx.Node] = {}
    for k in range(len(canon.input_meta)):
        env[("i", k)] = g.placeholder(f"in{k}")
    scalars = [g.placeholder(f"s{k}") for k in range(n_scalars)]

    def arg(a):
        if type(a) is Scalar:
            return _Lifted(scalars[a.k])
        if type(a) is tuple and len(a) == 2 and a[0] in ("i", "t") and type(a[1]) is int:
            return env[a]
        if type(a) is tuple and a and a[0] in ("list", "tuple"):
            items = [arg(x) for x in a[1:]]
            return items if a[0] == "list" else tuple(items)
        return a

    k = 0
    for e in canon.entries:
        if e[0] != "op":
            continue
        op = ops[e[1]]
        node = lower(g, op, tuple(arg(a) for a in e[2]), {n: arg(v) for n, v in e[3]})
        for name, path in zip(e[4], out_paths[k], strict=True):
            if name is None:  # an input returned by an in-place op: nothing new to name
                continue
            sub = node
            for i in path:  # a lowered op may give a list of nodes: index it directly
                sub = (
                    sub[i] if isinstance(sub, list) else g.call_function(operator.getitem, (sub, i))
                )
            env[name] = sub
        k += 1
    g.output(tuple(env[n] for n in canon.outputs))
    gm = fx.GraphModule(torch.nn.Module(), g)
    if fix_alpha:
        rewrite_alpha(gm)
    return gm


def rewrite_alpha(gm: fx.GraphModule) -> int:
    """Replace add/sub(x, y, alpha=a) by add/sub(x, mul(y, a)); returns how many were rewritten."""
    n = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        alpha = node.kwargs.get("alpha", 1)
        if alpha == 1:
            continue
        if node.target in _ALPHA_OPS and isinstance(node.args[1], fx.Node):
            with gm.graph.inserting_before(node):
                scaled = gm.graph.call_function(_aten.mul.Tensor, (node.args[1], alpha))
            node.args = (node.args[0], scaled, *node.args[2:])
        elif node.target in _FOREACH_ALPHA:
            with gm.graph.inserting_before(node):
                scaled = gm.graph.call_function(_aten._foreach_mul.Scalar, (node.args[1], alpha))
            node.args = (node.args[0], scaled, *node.args[2:])
        else:
            continue
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}
        n += 1
    if n:
        gm.recompile()
    return n


def compile_block(
    gm: fx.GraphModule, example_inputs: list, backend: str, mode: str | None, dynamic: bool
):
    """(compiled callable taking the inputs positionally, seconds spent compiling)."""
    t0 = time.perf_counter()
    with torch.no_grad():
        if dynamic:
            fn = torch.compile(gm, backend=backend, mode=mode, dynamic=True, fullgraph=True)
        elif backend == "inductor":
            fn = torch._TorchCompileInductorWrapper(mode, None, False)(gm, example_inputs)
        else:
            fn = torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    return fn, time.perf_counter() - t0
