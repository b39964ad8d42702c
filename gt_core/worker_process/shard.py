"""Sharding a worker group's tensors with DTensor: what is sharded, and how each op runs.

A signal whose spec says ``shard: {axis: A}`` (``capture(shard={"batch": 0})``,
``%%gt --shard batch=0``) shards the tensors made inside it: an upload, or an op with no
tensor input (``randn``, ``zeros``), is made whole on every rank (the same generator, the
same bytes), then each rank keeps its slice along A (``Shard(A)``: a local slice, no
communication). Every other value stays a plain tensor, which DTensor treats as
``Replicate()`` (implicit replication): parameters and optimizer state are whole on every
rank. An op with a DTensor argument runs as DTensor propagates it, except where that is
not known to equal eager, where it runs replicated (see ``ShardPolicy``).
"""

from __future__ import annotations

import functools

import torch
from torch.utils._pytree import tree_flatten, tree_map

from gt_core.errors import UnsupportedOperation

__all__ = ["ShardPolicy", "local", "whole"]


def _dtensor():
    from torch.distributed.tensor import DTensor

    return DTensor


def local(t):
    """This rank's part of ``t`` (a plain tensor: itself)."""
    return t._local_tensor if isinstance(t, _dtensor()) else t


def whole(t):
    """The whole value of ``t`` on every rank (a collective for a DTensor: every rank calls it)."""
    return t.full_tensor() if isinstance(t, _dtensor()) else t


class ShardPolicy:
    """Which tensors are sharded, and how an op with DTensor arguments runs.

    DTensor derives the sharding of an op without a rule of its own by tracing the op's
    decomposition, then runs the op itself on each rank's slice. Where the op reads a size
    as a number (``mse_loss_backward``'s ``2 / input.numel()`` with ``reduction='mean'``)
    the slice's size is not the whole's, and the result differs from eager's (gradients
    exactly ``world``x eager's, on torch 2.13). So an op runs through DTensor only if
    DTensor has a rule registered for it; every other op, and every random op (DTensor's
    CPU slices would draw other numbers than eager), runs replicated: its DTensor
    arguments made whole, the op on plain tensors (every rank alike), its outputs given
    back the placement of its first DTensor argument where the shape allows (a local
    slice), else ``Replicate()``; an argument written in place takes its part of the
    result. ``on_replicated(op_name, why)`` is told each such op once.
    """

    def __init__(self, world: int, device: torch.device, axes: dict, on_replicated):
        from torch.distributed.device_mesh import DeviceMesh

        self.mesh = DeviceMesh(device.type, list(range(world)))
        self.world = world
        self.axes = dict(axes)  # signal name -> the axis its tensors are sharded along
        self.axis: int | None = None  # the open sharded signal's axis
        self.on_replicated = on_replicated
        self.replicated: set = set()  # ops run replicated (told once each)
        from torch.distributed.tensor import DTensor

        prop = DTensor._op_dispatcher.sharding_propagator
        self._rules = (prop.op_strategy_funcs, prop.op_single_dim_strategy_funcs, prop.op_to_rules)

    # -- what is sharded ------------------------------------------------------------------
    def mark(self, name: str, phase: str) -> None:
        """A signal's mark: inside a sharded signal, new tensors are sharded."""
        if name in self.axes:
            self.axis = self.axes[name] if phase == "enter" else None

    def place(self, t):
        """A new tensor, made whole on this rank: sharded if a sharded signal is open."""
        if self.axis is None or not isinstance(t, torch.Tensor) or t.dim() <= self.axis:
            return t
        from torch.distributed.tensor import Shard, distribute_tensor

        return distribute_tensor(t, self.mesh, [Shard(self.axis)], src_data_rank=None)

    def made(self, result, args, kwargs):
        """An op's result: sharded if the op took no tensor and a sharded signal is open."""
        if self.axis is None or _has_tensor(args, kwargs):
            return result
        return tree_map(self.place, result)

    def call(self, op, args, kwargs):
        """An instruction's op: run (see ``run``), its outputs sharded if it made them inside
        a sharded signal (see ``made``)."""
        return self.made(self.run(op, args, kwargs), args, kwargs)

    def whole(self, t):
        """``t`` whole (every rank calls this at the same point: a collective)."""
        return whole(t)

    # -- how an op runs -------------------------------------------------------------------
    def run(self, op, args, kwargs):
        """``op(*args, **kwargs)`` on this rank, as eager gives it for the whole values."""
        DTensor = _dtensor()
        if not any(isinstance(x, DTensor) for x in tree_flatten((args, kwargs))[0]):
            return op(*args, **kwargs)
        if op is _LIFT_FRESH:  # (torch.tensor(data)'s: its argument itself, whatever it is)
            return args[0]
        why = self._why_replicated(op, args, kwargs)
        if why is not None:
            return self.replicate(op, args, kwargs, why)
        from torch.distributed.tensor.experimental import implicit_replication

        try:
            with implicit_replication():
                return op(*args, **kwargs)
        except Exception as exc:
            if _written(op, args, kwargs):  # (it may have written some of them: not run again)
                raise
            why = f"DTensor could not run it sharded ({type(exc).__name__}: {_first(exc)})"
        return self.replicate(op, args, kwargs, why)

    def read(self, op, args, kwargs):
        """A sync op (``.item()``, ``nonzero``, ``equal``: a value read out to the client):
        on whole values (DTensor reads this rank's part of a partial sum as the value)."""
        DTensor = _dtensor()
        if not any(isinstance(x, DTensor) for x in tree_flatten((args, kwargs))[0]):
            return op(*args, **kwargs)
        return self.replicate(op, args, kwargs, None)

    def _why_replicated(self, op, args, kwargs) -> str | None:
        if not isinstance(op, torch._ops.OpOverload):
            return None
        if any(not isinstance(x, _dtensor()) for x in _written(op, args, kwargs)):
            # (DTensor writes a plain tensor's copy, then fails: it is written here instead)
            return "it writes a whole tensor in place with a DTensor argument"
        if not any(op in r for r in self._rules):
            return (
                "DTensor has no sharding rule for it (one derived from its decomposition "
                "can differ from eager)"
            )
        if torch.Tag.nondeterministic_seeded in op.tags:
            return "a random op: sharded, each rank would draw other numbers than eager"
        return None

    def replicate(self, op, args, kwargs, why: str | None):
        """Run ``op`` on whole plain values; outputs placed back (see the class); ``why``
        told once per op (None: not told)."""
        DTensor = _dtensor()
        name = str(op)
        if why is not None and name not in self.replicated:
            self.replicated.add(name)
            self.on_replicated(name, why)
        flat, _ = tree_flatten((args, kwargs))
        # An output is whole and alike on every rank, so any layout of it is right: it takes
        # that of the first DTensor argument of its shape that is not a partial sum or average
        # (sharded values stay sharded: mse_loss_backward's gradient stays split like the
        # logits, not whole on every rank), else it is whole.
        layouts = {}
        for x in flat:
            if isinstance(x, DTensor) and not any(p.is_partial() for p in x.placements):
                layouts.setdefault(tuple(x.shape), x.placements)
        if _is_view(op):
            raise UnsupportedOperation(
                f"gt: {name} on a sharded tensor cannot run as DTensor runs it ({why}), and run "
                "on the whole tensor its result would be a copy, not a view: a write through "
                "it would not reach the tensor it views. Make the tensor whole before the view "
                "(shard another signal), or run without shard."
            )
        a, k = tree_map(lambda x: _whole_as(x) if isinstance(x, DTensor) else x, (args, kwargs))
        out = op(*a, **k)
        written = _written(op, args, kwargs)
        wholes = {id(w): d for d, w in zip(written, _written(op, a, k), strict=True)}
        for d, w in zip(written, _written(op, a, k), strict=True):
            if isinstance(d, DTensor):
                d._local_tensor.copy_(self._part(w, d.placements))

        def back(o):
            if not isinstance(o, torch.Tensor):
                return o
            if id(o) in wholes:  # an argument written in place, returned
                return wholes[id(o)]
            return self._dtensor_of(o, layouts.get(tuple(o.shape)))

        return tree_map(back, out)

    def _part(self, t, placements):
        """This rank's part of the whole plain tensor ``t`` laid out as ``placements`` (a
        one-dimensional mesh: one placement)."""
        from torch.distributed.tensor import Partial, Shard, distribute_tensor

        (p,) = placements
        if isinstance(p, Shard):
            return distribute_tensor(t, self.mesh, [p], src_data_rank=None).to_local()
        if isinstance(p, Partial) and p.reduce_op == "sum":  # (the parts add up to t)
            return t if self.mesh.get_local_rank() == 0 else torch.zeros_like(t)
        return t  # (Replicate, or a partial average, maximum or minimum of equal parts)

    def _dtensor_of(self, t, placements):
        """The whole plain tensor ``t`` as a DTensor laid out as ``placements`` (None:
        Replicate())."""
        from torch.distributed.tensor import DTensor, Replicate

        placements = tuple(placements or (Replicate(),))
        local = self._part(t, placements)
        return DTensor.from_local(
            local, self.mesh, placements, run_check=False, shape=t.shape, stride=t.stride()
        )

    # -- a block's graph ------------------------------------------------------------------
    def wrap_graph(self, gm) -> None:
        """Every aten call of a block's FX graph goes through ``run`` (eager and compiled)."""
        n = 0
        for node in gm.graph.nodes:
            if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
                node.target = _call(self, node.target)
                n += 1
        if n:
            gm.recompile()

    def prepare(self, gm, examples: list, placements, shared) -> list:
        """A block's graph to compile: its ops through ``run``; its example inputs laid out
        as the block's inputs are (``placements``; None: plain)."""
        self.wrap_graph(gm)
        placements = list(placements or [])
        if not any(p is not None for p in placements):
            return examples
        if shared is not None:
            raise NotImplementedError(
                "sharded inputs that share memory with other inputs: not compiled (it runs eagerly)"
            )
        out = list(examples)
        for k, p in enumerate(placements):
            if p is not None:
                out[k] = self._dtensor_of(examples[k], p)
        return out


_LIFT_FRESH = torch.ops.aten.lift_fresh.default


def _call(policy: ShardPolicy, op):
    """A function calling ``op`` through ``policy`` (an FX node's target)."""

    @functools.wraps(op)
    def call(*args, **kwargs):
        return policy.run(op, args, kwargs)

    call.__name__ = call.__qualname__ = "sharded_" + str(op).replace(".", "_")
    call.__module__ = __name__
    return call


def _whole_as(d):
    """The whole value of DTensor ``d`` with the strides eager would give it (``d``'s own:
    the op then lays its result out as eager does, and a later view of it applies)."""
    t = d.full_tensor()
    if t.stride() == d.stride() or 0 in d.stride():
        return t
    return torch.empty_strided(d.shape, d.stride(), dtype=t.dtype, device=t.device).copy_(t)


def _is_view(op) -> bool:
    """Whether ``op`` returns a view of an argument (not written in place)."""
    if not isinstance(op, torch._ops.OpOverload) or not op._schema.returns:
        return False
    alias = op._schema.returns[0].alias_info
    return alias is not None and not alias.is_write


def _has_tensor(args, kwargs) -> bool:
    return any(isinstance(x, torch.Tensor) for x in tree_flatten((args, kwargs))[0])


def _written(op, args, kwargs) -> list:
    """The tensor arguments ``op`` writes in place (in schema order)."""
    out = []
    if not isinstance(op, torch._ops.OpOverload):
        return out
    for i, a in enumerate(op._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        out.extend(v if isinstance(v, (list, tuple)) else [v])
    return [x for x in out if isinstance(x, torch.Tensor)]


def _first(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]
