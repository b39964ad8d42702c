"""Compiler: a hot block's canonical form → an FX graph of aten calls → a compiled function.

The graph's inputs are the block's external values (in canonical order), its outputs the
values produced and not freed inside it; in-place mutations of inputs stay in the graph
(AOTAutograd functionalizes them and writes them back). The backend is called directly on
the aten-level graph, as torch.compile does after Dynamo: the graph is already traced, and
our signature is its guard, so there is nothing for Dynamo to add.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import threading
import time

import torch
import torch.fx as fx

from gt_core.compile.rng_layout import pin_random_layouts
from gt_core.stream.canonical import Canonical
from gt_core.stream.lift import Lifted, Scalar, lower
from gt_core.stream.placement import NONE, kind_of, placed

__all__ = [
    "build_graph",
    "compile_block",
    "cudagraph_skips",
    "mutated_inputs",
    "relax_views",
    "replay_here",
    "rewrite_alpha",
    "uses_cudagraphs",
]

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
    canon: Canonical,
    ops: dict,
    out_paths: dict,
    fix_alpha: bool = True,
    n_scalars: int = 0,
    lift: bool = True,
    device: torch.device | None = None,
) -> fx.GraphModule:
    """The block as an FX GraphModule; ``out_paths[k]`` locates op k's outputs in its result.

    Its inputs are the block's values, then its ``n_scalars`` lifted scalars: 0-d tensors
    (the ops that take them rewritten to tensor forms: see _lift.lower), or with
    ``lift=False`` the Python floats themselves, every op called as the instructions call
    it (with fix_alpha=False: the block's eager form, equal to running its instructions).
    Ops that name a device make their tensors on ``device``, the worker's, as the executor
    places them (stream.placement): what the client recorded names its CPU.
    """
    g = fx.Graph()
    env: dict[tuple, fx.Node] = {}
    for k in range(len(canon.input_meta)):
        env[("i", k)] = g.placeholder(f"in{k}")
    scalars = [g.placeholder(f"s{k}") for k in range(n_scalars)]

    def arg(a):
        if type(a) is Scalar:
            return Lifted(scalars[a.k]) if lift else scalars[a.k]
        if type(a) is tuple and len(a) == 2 and a[0] in ("i", "t") and type(a[1]) is int:
            return env[a]
        if type(a) is tuple and a and a[0] in ("list", "tuple"):
            items = [arg(x) for x in a[1:]]
            return items if a[0] == "list" else tuple(items)
        return a

    k = 0
    for e in canon.entries:
        if e.kind != "op":
            continue
        op = ops[e.op]
        args, kwargs = tuple(arg(a) for a in e.args), {n: arg(v) for n, v in e.kwargs}
        if device is not None and (kind := kind_of(op)) != NONE:
            kwargs = placed(kwargs, device, kind)
        node = lower(g, op, args, kwargs) if lift else g.call_function(op, args, kwargs)
        for name, path in zip(e.outs, out_paths[k], strict=True):
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
    if lift:
        relax_views(gm)
    return gm


_VIEWS = {_aten.view.default, _aten._unsafe_view.default}


def relax_views(gm: fx.GraphModule) -> int:
    """Replace ``view`` by ``reshape`` where nothing writes the memory it views; how many.

    A recorded ``view`` applies to the strides eager gave its input. A compiler may lay that
    input out otherwise (an ``expand`` of a transposed key before a batched matmul, in the
    backward of attention), and the view no longer applies: the compile failed with "Cannot
    view a tensor ...". ``reshape`` is the same values whatever the layout; it differs from
    ``view`` only in that it may copy, which matters only where the memory is written in
    place (a write through the view, or to what it views, must reach the other): those
    views are kept.
    """
    root, written = _aliasing(gm)
    # A view the block returns keeps its strides: the next step's instructions name them.
    (out,) = gm.graph.find_nodes(op="output")
    returned = {a for a in out.args[0] if isinstance(a, fx.Node)}
    n = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _VIEWS and node not in returned:
            base = node.args[0]
            if root.get(base, base) not in written and root.get(node, node) not in written:
                node.target = _aten.reshape.default
                n += 1
    if n:
        gm.recompile()
    return n


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
    """(compiled callable taking the inputs positionally, seconds spent compiling).

    Where inductor's mode records CUDA graphs (reduce-overhead, max-autotune) on a GPU, the
    inputs the block updates in place (parameters, optimizer state) are declared static, as
    Dynamo declares a module's parameters: CUDA graph trees then keep them in place rather
    than skipping graphs for "mutated inputs". Each call then starts a new step and returns
    outputs of its own, so a value kept from an earlier step is never overwritten.

    Inductor's random ops are pinned to eager's layouts first (compile.rng_layout): it would
    lay a dropout's mask out otherwise, and draw another mask than eager's.

    Compiled with grad mode on (the inputs require no grad, so AOTAutograd makes an inference
    graph all the same): inductor traces its attention patterns' training forms with autograd,
    and under no_grad that trace came back empty and failed the compile (``assert gm``).
    """
    t0 = time.perf_counter()
    with torch.enable_grad():
        if dynamic:
            fn = torch.compile(gm, backend=backend, mode=mode, dynamic=True, fullgraph=True)
        elif backend == "inductor":
            pin_random_layouts(gm, example_inputs)
            devices = [t.device for t in example_inputs if isinstance(t, torch.Tensor)]
            graphs = bool(devices) and uses_cudagraphs(mode, devices[0])
            if graphs:
                _declare_static(gm, mutated_inputs(gm))
            fn = torch._TorchCompileInductorWrapper(mode, None, False)(gm, example_inputs)
            if graphs:
                fn = _steps(fn)
        else:
            fn = torch._dynamo.lookup_backend(backend)(gm, example_inputs)
    return fn, time.perf_counter() - t0


def uses_cudagraphs(mode: str | None, device: torch.device) -> bool:
    """Whether inductor's ``mode`` records CUDA graphs for a graph on ``device``."""
    if device.type != "cuda":
        return False
    from torch._inductor import list_mode_options

    return bool(list_mode_options(mode).get("triton.cudagraphs", False))


def replay_here() -> None:
    """Set up CUDA graph trees' per-thread state in this thread, the one that will call blocks.

    The trees keep it in thread-local storage made where their module is first imported; a
    block compiled in a background thread imports it there, and its first replay in the
    worker's thread then failed an assertion. Called before a background compile starts.
    """
    from torch._inductor import cudagraph_trees as trees

    if not torch._C._is_key_in_tls("tree_manager_containers"):
        trees._initialize_tls(trees.local)


def mutated_inputs(gm: fx.GraphModule) -> list[int]:
    """Positions of the graph's inputs that an op updates in place (directly or via a view)."""
    _, written = _aliasing(gm)
    return [k for k, n in enumerate(gm.graph.find_nodes(op="placeholder")) if n in written]


def _aliasing(gm: fx.GraphModule) -> tuple[dict, set]:
    """(node -> the node whose memory it views, for views; the nodes whose memory an op
    writes in place, directly or through a view)."""
    root: dict[fx.Node, fx.Node] = {}
    written: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:  # an item of split/unbind views what they view
            base = node.args[0]
            if isinstance(base, fx.Node):
                root[node] = root.get(base, base)
            continue
        if not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema
        for i, a in enumerate(schema.arguments):
            if a.alias_info is None:
                continue
            v = node.args[i] if i < len(node.args) else node.kwargs.get(a.name)
            items = v if isinstance(v, (list, tuple)) else (v,)
            bases = [root.get(x, x) for x in items if isinstance(x, fx.Node)]
            if a.alias_info.is_write:
                written.update(bases)
            elif bases and schema.returns and schema.returns[0].alias_info is not None:
                root[node] = bases[0]
    return root, written


def _declare_static(gm: fx.GraphModule, static: list[int]) -> None:
    """Mark inputs as AOTAutograd reads Dynamo's static inputs (its metadata, nothing more)."""
    from torch._dynamo.source import LocalSource

    gm.meta["dynamo_compile_id"] = None
    gm._param_name_to_source = {}
    for k, node in enumerate(gm.graph.find_nodes(op="placeholder")):
        node._dynamo_source = LocalSource(node.name)
        if k in static:
            node.meta["tensor_dict"] = {"_dynamo_static_input_type": "unguarded"}


def _steps(fn):
    """``fn`` under CUDA graph trees, each call a step of its own with outputs it owns."""
    mark = torch.compiler.cudagraph_mark_step_begin

    def run(*args):
        mark()
        return [o.clone() if isinstance(o, torch.Tensor) else o for o in fn(*args)]

    return run


@contextlib.contextmanager
def cudagraph_skips():
    """Yields a list that collects why inductor skipped CUDA graphs in this thread meanwhile.

    The reasons (its log, or its counter where nothing was logged) are reported in gt's events
    instead of as warnings on the worker's stderr.
    """
    from torch._dynamo.utils import counters

    reasons: list[str] = []
    me = threading.get_ident()

    def take(record: logging.LogRecord) -> bool:
        if record.thread != me:
            return True
        reasons.append(record.getMessage().strip())
        return False

    logger = logging.getLogger("torch._inductor.cudagraph_utils.__cudagraphs")
    before = counters["inductor"]["cudagraph_skips"]
    logger.addFilter(take)
    try:
        yield reasons
    finally:
        logger.removeFilter(take)
        unlogged = counters["inductor"]["cudagraph_skips"] - before - len(reasons)
        reasons.extend(
            ["skipped, no reason logged (counters['inductor']['cudagraph_skips'])"]
            * max(unlogged, 0)
        )
