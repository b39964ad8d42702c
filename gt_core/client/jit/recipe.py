"""A jitted step's recording and its recipe: what a replayed call reads where, and leaves where.

Two recorded calls alike (``Recording``, ``differ``) and the worker's plan of their block
make a ``Recipe``: the block's inputs as places in the step's reachable state (or its
arguments), its outputs as the places the recorded call left them in (see ``reach``).
"""

from __future__ import annotations

import collections

import torch
from torch.utils._pytree import tree_flatten

from gt_core.client.jit.reach import Place, id_before
from gt_core.client.jit.settings import agree, knobs, settings_in
from gt_core.client.plan_match import Candidate
from gt_core.client.proxy import Proxy
from gt_core.client.uploads import CONSTANT_NUMEL
from gt_core.observe.jit_states import JitReason
from gt_core.stream.instructions import FREE, OP, PUT, Ref, op_name, without_ids
from gt_core.stream.lift import Scalar

OUT = "gt-jit-output"  # a result leaf that is the block's output (OUT, its index)


class Refused(Exception):
    """The recorded calls cannot be replayed: ``reason`` (a JitReason) says why."""

    def __init__(self, reason: JitReason):
        super().__init__(reason.text())
        self.reason = reason


class Recording:
    """One recorded call: what it read where, what it left where, its instructions."""

    def __init__(self, leaves, roots, reached, after, result, instrs, puts=()):
        self.arg_ids = {x._gt_id: i for i, x in enumerate(leaves) if type(x) is Proxy}
        self.arg_keys = {i: x._gt_k for i, x in enumerate(leaves) if type(x) is Proxy}
        self.roots = [(place, obj) for place, obj in roots if place is not None]
        self.before, self.after = reached.slots, after
        self.optimizers = reached.optimizers  # (found by the same walk as the tensors)
        self.result_leaves, self.result_spec = tree_flatten(result)
        self.instrs = instrs
        self._shape: list | None = None  # (shape() and floats(), made once: see there)
        self._floats: list | None = None
        self.puts = list(puts)  # (value id, proxy, host copy or None, (file, line)) per upload
        self.syncs = 0
        self.sync_at = None  # the user's line of the call's last sync
        # The optimizers' settings as the call began ([{key: value}] per param group), the
        # numbers computed from them that the call passed to ops (jit_knobs.attribute), and
        # those that flow into the block: {site: expressions}, filled in by differ (several
        # where settings had equal values: each must give the same number at a replay).
        self.settings: list = []
        self.knob_floats: dict = {}
        self.flowing: dict = {}
        self.changed: set = set()  # settings (group, key) that differ from the call before
        self.forced: list = []  # param groups made capturable while it recorded (traced)
        self.skipped: list = []  # param groups left as written: their lr was zero (traced)

    def unreplayable(self) -> JitReason | None:
        if self.syncs:
            return JitReason("sync", n=self.syncs, line=_line(self.sync_at))
        other = [ins for ins in self.instrs if ins.code not in (OP, FREE, PUT)]
        if other:
            return JitReason("seeds")
        for _, _, host, where in self.puts:
            if host is None:
                return JitReason("uploads", n=CONSTANT_NUMEL, line=_line(where))
        return None

    def written_constant(self, op_index: dict) -> JitReason | None:
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
                    where = _line(ids[_refers(v, ids)])
                    return JitReason("written_constant", op=op_name(op), line=where)
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
        """The instructions without their ids (what two calls must share); made once."""
        if self._shape is None:
            self._shape = [_shape(ins) for ins in self.instrs]
        return self._shape

    def floats(self) -> list:
        """(op, argument, value, site) of every Python float the call passed to an op; its
        site: (position among the OP and FREE instructions, path in the arguments). Made
        once."""
        if self._floats is not None:
            return self._floats
        out = self._floats = []
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


def differ(a: Recording, b: Recording, ops: dict) -> JitReason | None:
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
            return JitReason("python_number", op=str(ops.get(i, i)), arg=where, old=x, new=y)
    for (_, _, x, _), (_, _, y, where) in zip(a.puts, b.puts, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return JitReason("host_data_changes", line=_line(where), old=_brief(x), new=_brief(y))
    for x, y in zip(a.result_leaves, b.result_leaves, strict=True):
        if type(x) is not Proxy and x != y:
            return JitReason("python_result", old=x, new=y)
    return None


def _number(v) -> bool:
    """A setting that can flow: a float, or a tuple of them (betas); never compared as a
    tensor (that would be a sync)."""
    return type(v) is float or (type(v) is tuple and all(type(x) is float for x in v))


def _flows(a: Recording, b: Recording, site, x: float, y: float) -> bool:
    """Whether the number at ``site`` (``x`` in call ``a``, ``y`` in ``b``) is an expression
    of each call's optimizer settings; if so, it flows (``b.flowing``). Every expression that
    gives both numbers is kept (two param groups with one lr: either could be the origin), and
    a replay sends the number only while they all agree (``settings.agree``)."""
    found = tuple(
        expr
        for expr in b.knob_floats.get(site, ())
        if agree((expr,), a.settings) == x and agree((expr,), b.settings) == y
    )
    if found:
        b.flowing[site] = found
    return bool(found)


def _line(where) -> str | None:
    return f"{where[0]}:{where[1]}" if where else None


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
        self.plan, self.rec = plan, rec  # (what an audited call is compared with)
        self.sig = plan.sig
        self.roots = rec.roots
        self.n_produced = len(occ.produced)
        self._find_inputs(occ, rec)
        self.input_ids = list(occ.inputs)  # (the value ids the recorded call's block read)
        freed = {ins.vid for ins in rec.instrs if ins.code == FREE}
        alive = [k for k, vid in enumerate(occ.produced) if vid not in freed]
        index = {occ.produced[k]: j for j, k in enumerate(alive)}
        metas: dict[int, tuple] = {}  # value id -> metadata, of each output put somewhere
        self._place_outputs(rec, index, metas)
        self._result(rec, index, metas)
        missing = [occ.produced[k] for k in alive if occ.produced[k] not in metas]
        if missing:
            raise Refused(JitReason("kept_alive", n=len(missing)))
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
        # numbers, so a change (an LR scheduler's step) means recording again.
        self.optimizers = rec.optimizers
        self.forced = rec.forced  # param groups the recorded call ran capturable (traced)
        # The block's lifted numbers, each the expressions of those settings that gave it
        # (jit.settings); the settings that changed between the recorded calls flow, the
        # others stay compared. A replay evaluates each distinct set of expressions once.
        scalars, self.scalar_sites = _scalar_exprs(plan, rec)
        self.distinct = list(dict.fromkeys(scalars))
        at = {e: k for k, e in enumerate(self.distinct)}
        self.scalar_ix = [at[e] for e in scalars]
        self.flowing = frozenset(
            s for es in self.distinct for e in es for s in settings_in(e) if s in rec.changed
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
                raise Refused(JitReason("unreachable"))

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
                raise Refused(JitReason("moves_tensor", place=place.describe()))

    def _result(self, rec: Recording, index: dict, metas: dict) -> None:
        """``result``: the call's result leaves, outputs as (OUT, output); ``single``: the one
        output when the result is that tensor alone (returned without pytree)."""
        self.result_spec = rec.result_spec
        self.result = []
        for x in rec.result_leaves:
            if type(x) is Proxy:
                if x._gt_id not in index:
                    raise Refused(JitReason("returns_input"))
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


def _scalar_exprs(plan, rec: Recording) -> tuple[list, list]:
    """The expressions of each lifted number of ``plan``'s block (refused: one without), and
    each one's site in the recorded call."""
    out: list = [None] * plan.n_scalars
    sites: list = [None] * plan.n_scalars
    for j, e in enumerate(plan.entries):
        if e.kind == "op":
            for k, path in _scalar_paths(e):
                out[k], sites[k] = rec.flowing.get((j, path)), (j, path)
                if out[k] is None:
                    raise Refused(
                        JitReason("python_number", op=f"entry {j}'s op", arg=f"argument {path}")
                    )
    return out, sites


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
            raise Refused(JitReason("plan_mismatch", what=f"instruction {occ.pos}"))
    if occ.pos != occ.n:
        raise Refused(JitReason("plan_mismatch", what="the block is shorter"))
    return occ
