"""A jitted step's recording and its recipe: what a replayed call reads where, and leaves where.

Two recorded calls alike (``Recording``, ``differ``) and the worker's plan of their block
make a ``Recipe``: the block's inputs as places in the step's reachable state (or its
arguments), its outputs as the places the recorded call left them in (see ``jit_places``).
"""

from __future__ import annotations

import collections

import torch
from torch.utils._pytree import tree_flatten

from gt_core.client.jit_knobs import evaluate, settings_in
from gt_core.client.jit_places import Place, id_before
from gt_core.client.jit_traced import knobs, optimizers
from gt_core.client.plan_match import Candidate
from gt_core.client.proxy import Proxy
from gt_core.client.uploads import CONSTANT_NUMEL
from gt_core.stream.instructions import FREE, OP, PUT, Ref, op_name, without_ids
from gt_core.stream.lift import Scalar

OUT = "gt-jit-output"  # a result leaf that is the block's output (OUT, its index)


class Refused(Exception):
    pass


class Recording:
    """One recorded call: what it read where, what it left where, its instructions."""

    def __init__(self, leaves, roots, before, after, result, instrs, puts=()):
        self.arg_ids = {x._gt_id: i for i, x in enumerate(leaves) if type(x) is Proxy}
        self.arg_keys = {i: x._gt_k for i, x in enumerate(leaves) if type(x) is Proxy}
        self.roots = [(place, obj) for place, obj in roots if place is not None]
        self.all_roots = roots
        self.before, self.after = before, after
        self.result_leaves, self.result_spec = tree_flatten(result)
        self.instrs = instrs
        self.puts = list(puts)  # (value id, proxy, host copy or None, (file, line)) per upload
        self.syncs = 0
        self.sync_at = None  # the user's line of the call's last sync
        # The optimizers' settings as the call began ([{key: value}] per param group), the
        # numbers computed from them that the call passed to ops (jit_knobs.attribute), and
        # those that flow into the block: {site: expression}, filled in by differ.
        self.settings: list = []
        self.knob_floats: dict = {}
        self.flowing: dict = {}
        self.changed: set = set()  # settings (group, key) that differ from the call before

    def unreplayable(self) -> str | None:
        if self.syncs:
            return (
                f"a sync inside the step ({self.syncs} per call{_last_at(self.sync_at)}): "
                "replay cannot answer it (.item(), printing a tensor, a data-dependent shape, "
                "torch.get_rng_state as torch.utils.checkpoint calls it), the function keeps "
                "running"
            )
        other = [ins for ins in self.instrs if ins.code not in (OP, FREE, PUT)]
        if other:
            return (
                "the step seeds or sets the random generator each call (torch.manual_seed "
                "inside it): move that out of the jitted function"
            )
        for _, _, host, where in self.puts:
            if host is None:
                return (
                    f"the step makes a tensor of more than {CONSTANT_NUMEL} elements from host "
                    f"data each call{_at(where)}: data belongs in the arguments"
                )
        return None

    def written_constant(self, op_index: dict) -> str | None:
        """Why a tensor the step makes from host data cannot be a constant: a write to it."""
        ids = {vid: where for vid, _, _, where in self.puts}
        ops = {idx: op for op, idx in op_index.items()}
        for ins in self.instrs:
            if ins.code != OP or not ids:
                continue
            op = ops.get(ins.op)
            schema = getattr(op, "_schema", None)
            if schema is None:
                continue
            for a, v in zip(schema.arguments, ins.args):  # noqa: B905 (defaults omitted)
                if a.alias_info is not None and a.alias_info.is_write and _refers(v, ids):
                    return (
                        f"the step makes a tensor from host data{_at(ids[_refers(v, ids)])} "
                        f"and writes it in place ({op_name(op)}): replay would reuse it written"
                    )
        return None

    def constants(self) -> list[dict]:
        """The tensors made from host data that a replay keeps as recorded: {shape, dtype, where}."""
        return [
            {
                "shape": list(h.shape),
                "dtype": str(h.dtype).removeprefix("torch."),
                "where": f"{w[0]}:{w[1]}" if w else None,
            }
            for _, _, h, w in self.puts
            if h is not None
        ]

    def shape(self) -> list:
        """The instructions without their ids (what two calls must share)."""
        return [_shape(ins) for ins in self.instrs]

    def floats(self) -> list:
        """(op, argument, value, site) of every Python float the call passed to an op; its
        site: (position among the OP and FREE instructions, path in the arguments)."""
        out = []
        j = 0
        for ins in self.instrs:
            if ins.code == OP:
                for where, v, path in _float_args(ins):
                    out.append((ins.op, where, v, (j, path)))
            if ins.code in (OP, FREE):
                j += 1
        return out

    def frozen(self, ops: dict) -> list[dict]:
        """The Python numbers a replay keeps as recorded: {op, arg, value, count} each."""
        counts = collections.Counter(
            (ops.get(i, str(i)), w, v)
            for i, w, v, site in self.floats()
            if site not in self.flowing
        )
        return [{"op": o, "arg": w, "value": v, "count": n} for (o, w, v), n in counts.items()]


def differ(a: Recording, b: Recording, ops: dict) -> str | None:
    """Why two recorded calls cannot share one replay (None: they can)."""
    if len(a.instrs) != len(b.instrs) or a.shape() != b.shape():
        return None  # other work: the worker sees another block; recording goes on
    b.flowing = {}
    b.changed = {
        (i, key)
        for i, (x, y) in enumerate(zip(a.settings, b.settings, strict=False))  # (groups added)
        for key in y
        if _number(y.get(key)) and x.get(key) != y.get(key)
    }
    for (i, where, x, site), (_, _, y, _) in zip(a.floats(), b.floats(), strict=True):
        if x != y and not _flows(a, b, site, x, y):
            return (
                f"a Python number the step passes to {ops.get(i, i)} ({where}) changed between "
                f"calls ({x!r} -> {y!r}): replay would freeze it. Make it a tensor (e.g. "
                "lr=torch.tensor(...), capturable=True), or keep calling without jit"
            )
    for (_, _, x, _), (_, _, y, where) in zip(a.puts, b.puts, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return (
                f"a tensor the step makes from host data{_at(where)} changes between calls "
                f"({_brief(x)} -> {_brief(y)}): that is data; pass it as an argument"
            )
    for x, y in zip(a.result_leaves, b.result_leaves, strict=True):
        if type(x) is not Proxy and x != y:
            return f"the step returns a Python value that changes ({x!r} -> {y!r})"
    return None


def _number(v) -> bool:
    """A setting that can flow: a float, or a tuple of them (betas); never compared as a
    tensor (that would be a sync)."""
    return type(v) is float or (type(v) is tuple and all(type(x) is float for x in v))


def _flows(a: Recording, b: Recording, site, x: float, y: float) -> bool:
    """Whether the number at ``site`` (``x`` in call ``a``, ``y`` in ``b``) is the same
    expression of each call's optimizer settings; if so, it flows (``b.flowing``)."""
    for expr in b.knob_floats.get(site, ()):
        try:
            if evaluate(expr, a.settings) == x and evaluate(expr, b.settings) == y:
                b.flowing[site] = expr
                return True
        except (IndexError, KeyError, TypeError, ValueError, ArithmeticError):
            continue
    return False


def _at(where) -> str:
    return f" (at {where[0]}:{where[1]})" if where else ""


def _last_at(where) -> str:
    return f", the last at {where[0]}:{where[1]}" if where else ""


def _brief(t) -> str:
    if t.numel() <= 4:
        return str(t.tolist())
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"


def _refers(v, ids: dict):
    """The value id in ``ids`` that argument ``v`` refers to, or None."""
    if type(v) is Ref:
        return v.id if v.id in ids else None
    if type(v) in (list, tuple):
        return next((r for r in (_refers(x, ids) for x in v) if r is not None), None)
    return None


def _shape(ins) -> tuple:
    if ins.code == FREE:
        return (FREE,)
    if ins.code == PUT:
        return (PUT,)
    return (
        OP,
        ins.op,
        without_ids(ins.args),
        tuple(sorted((k, without_ids(v)) for k, v in ins.kwargs.items())),
        tuple(o is None for o in ins.outs),
    )


def _float_args(ins):
    for i, a in enumerate(ins.args):
        yield from _floats(a, f"argument {i}", (i,))
    for k, v in ins.kwargs.items():
        yield from _floats(v, k, (k,))


def _floats(a, where, path):
    if type(a) is float:
        yield where, a, path
    elif type(a) in (list, tuple):
        for j, x in enumerate(a):
            yield from _floats(x, f"{where}[{j}]", (*path, j))


class Recipe:
    """What a replayed call does: where each input is read, where each output goes."""

    def __init__(self, plan, rec: Recording):
        occ = _matched(plan, rec)
        self.sig = plan.sig
        self.roots = rec.roots
        self.n_produced = len(occ.produced)
        self._find_inputs(occ, rec)
        freed = {ins.vid for ins in rec.instrs if ins.code == FREE}
        alive = [k for k, vid in enumerate(occ.produced) if vid not in freed]
        index = {occ.produced[k]: j for j, k in enumerate(alive)}
        metas: dict[int, tuple] = {}  # value id -> metadata, of each output put somewhere
        self._place_outputs(rec, index, metas)
        self._result(rec, index, metas)
        missing = [occ.produced[k] for k in alive if occ.produced[k] not in metas]
        if missing:
            raise Refused(
                f"{len(missing)} tensor(s) the step makes stay alive where jit cannot put them "
                "again (e.g. appended to a list, or kept by an autograd graph): return them"
            )
        self.outputs = [(k, metas[occ.produced[k]]) for k in alive]
        # What a replayed call reads, flat: (getter, container, key) per input (the getter
        # None for an argument: leaves[key]), each one's metadata key, and the roots the same
        # way (see _Entry._replay's fast path).
        self.readers = [
            (None, None, src) if type(src) is int else src.reader() for src, _ in self.inputs
        ]
        self.keys = [k for _, k in self.inputs]
        self.root_readers = [place.reader() for place, _ in self.roots]
        self.root_objs = [obj for _, obj in self.roots]
        # The optimizers the step can reach, and their settings now: the block holds them as
        # numbers, so a change (an LR scheduler's step) means recording again (jit._retune).
        self.optimizers = optimizers(obj for _, obj in rec.all_roots)
        # The block's lifted numbers, each an expression of those settings (jit_knobs); the
        # settings that changed between the recorded calls flow, the others stay compared.
        self.scalars = _scalar_exprs(plan, rec)
        self.flowing = frozenset(
            s for e in self.scalars for s in settings_in(e) if s in rec.changed
        )
        self.knobs = knobs(self.optimizers, self.flowing)

    def _find_inputs(self, occ: Candidate, rec: Recording) -> None:
        """``inputs``: per block input, (its place or argument index, its metadata key)."""
        before = {}
        for place, p in rec.before:
            if p is not None:
                before.setdefault(p._gt_id, (place, p))
        self.inputs = []
        # The tensors made from host data (equal on the recorded calls): kept alive here, and
        # read from here by every replay.
        self.constants = [p for _, p, _, _ in rec.puts]
        made = {vid: j for j, (vid, _, _, _) in enumerate(rec.puts)}
        for vid in occ.inputs:
            if vid in made:
                p = self.constants[made[vid]]
                self.inputs.append((Place("item", self.constants, made[vid]), p._gt_k))
            elif vid in rec.arg_ids:
                i = rec.arg_ids[vid]
                self.inputs.append((i, rec.arg_keys[i]))
            elif vid in before:
                place, p = before[vid]
                self.inputs.append((place, p._gt_k))
            else:
                raise Refused(
                    "the step reads a worker tensor jit cannot find again: not an argument, nor "
                    "reachable from its closure or globals, or those of the functions it calls "
                    "(through modules, optimizers, dicts, lists, objects' attributes)"
                )

    def _place_outputs(self, rec: Recording, index: dict, metas: dict) -> None:
        """``placed``: (place, output) the recorded call left there; ``cleared``: places it
        emptied."""
        self.placed, self.cleared = [], []
        places_after = {place.ident(): (place, p) for place, p in rec.after}
        for key, (place, p) in places_after.items():
            was = id_before(rec.before, key)
            now = p._gt_id if p is not None else None
            if was == now:
                continue
            if now is None:
                self.cleared.append(place)
            elif now in index:
                self.placed.append((place, index[now]))
                metas[now] = p._gt_m
            else:
                raise Refused(f"the step moves a tensor into {place.describe()}: replay cannot")

    def _result(self, rec: Recording, index: dict, metas: dict) -> None:
        """``result``: the call's result leaves, outputs as (OUT, output); ``single``: the one
        output when the result is that tensor alone (returned without pytree)."""
        self.result_spec = rec.result_spec
        self.result = []
        for x in rec.result_leaves:
            if type(x) is Proxy:
                if x._gt_id not in index:
                    raise Refused("the step returns a tensor it did not make (an input)")
                self.result.append((OUT, index[x._gt_id]))
                metas[x._gt_id] = x._gt_m
            else:
                self.result.append(x)
        one = (
            len(self.result) == 1
            and type(self.result[0]) is tuple
            and rec.result_spec.num_nodes == 1
        )
        self.single = self.result[0][1] if one else None


def _scalar_exprs(plan, rec: Recording) -> list:
    """The expression of each lifted number of ``plan``'s block (refused: one without)."""
    out: list = [None] * plan.n_scalars
    for j, e in enumerate(plan.entries):
        if e.kind == "op":
            for k, path in _scalar_paths(e):
                out[k] = rec.flowing.get((j, path))
                if out[k] is None:
                    raise Refused(
                        f"a Python number the step passes to an op (entry {j}, {path}) changes "
                        "between calls and is not computed from an optimizer's settings: make "
                        "it a tensor, or keep calling without jit"
                    )
    return out


def _scalar_paths(e):
    """(k, path) of each lifted number (a Scalar) in a plan entry's arguments."""
    found: list = []

    def walk(t, path):
        if type(t) is Scalar:
            found.append((t.k, path))
        elif type(t) in (list, tuple):
            for i, x in enumerate(t):
                walk(x, (*path, i))

    for i, t in enumerate(e.args):
        walk(t, (i,))
    for k, t in e.kwargs.items():
        walk(t, (k,))
    return found


def _matched(plan, rec: Recording) -> Candidate:
    """The worker's plan matched against the recorded call's instructions, whole."""
    occ = Candidate(plan)
    for ins in rec.instrs:
        if ins.code == PUT:
            continue  # (its value is an input of the block: a constant below)
        if not occ.match(ins):
            raise Refused("the worker's block does not match the recorded call")
    if occ.pos != occ.n:
        raise Refused("the worker's block is shorter than the recorded call")
    return occ
