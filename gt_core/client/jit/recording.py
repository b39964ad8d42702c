"""A jitted step's recorded call, and what two of them say together.

A ``Recording`` is one call as it ran: what it read where, what it left where, its
instructions and the numbers it passed. Two alike make a recipe (``recipe``); ``differ`` says
why they cannot (a typed reason), and which numbers flow from the optimizers' settings;
``guards`` which Python values a replay compares first.
"""

from __future__ import annotations

import collections

import torch
from torch.utils._pytree import tree_flatten

from gt_core.client.jit.instr_parts import float_args, refers, shape_of
from gt_core.client.jit.knob import agree, failed, settings_in
from gt_core.client.jit.program import differs
from gt_core.client.recording.meta import where_free_key
from gt_core.client.recording.proxy import Proxy
from gt_core.client.recording.uploads import CONSTANT_NUMEL
from gt_core.observe.jit_states import JitReason
from gt_core.stream.instructions import FREE, OP, PUT, op_name

__all__ = ["Recording", "Refused", "differ", "guards", "mutated"]


class Refused(Exception):
    """The recorded calls cannot be replayed: ``reason`` (a JitReason) says why."""

    def __init__(self, reason: JitReason):
        super().__init__(reason.text())
        self.reason = reason


class Recording:
    """One recorded call: what it read where, what it left where, its instructions."""

    def __init__(self, leaves, roots, reached, after, result, instrs, puts=(), **ended):
        """``ended``: what the call did besides its instructions, as its block ended (the
        fields below, by name; those not given: none)."""
        self.arg_ids = {x.gt_value_id: i for i, x in enumerate(leaves) if type(x) is Proxy}
        # (an argument's key wherever its storage begins, and where it begins: see offsets)
        self.arg_keys = {i: where_free_key(x) for i, x in enumerate(leaves) if type(x) is Proxy}
        self.arg_offsets = {i: x.gt_meta[3] for i, x in enumerate(leaves) if type(x) is Proxy}
        self.roots = [(place, obj) for place, obj in roots if place is not None]
        self.before, self.after = reached.slots, after
        self.optimizers = reached.optimizers  # (found by the same walk as the tensors)
        self.holders = reached.holders  # (where the walk found each container of a slot)
        self.scalars = reached.scalars  # the Python numbers it could read, as it began
        self.result_leaves, self.result_spec = tree_flatten(result)
        self.instrs = instrs
        self._shape: list | None = None  # (shape() and floats(), made once: see there)
        self._floats: list | None = None
        self.puts = list(puts)  # (value id, proxy, host copy or None, (file, line)) per upload
        get = ended.pop
        self.syncs = get("syncs", 0)
        self.reads = get("reads", 0)  # values answered from shadows (client.shadows)
        self.program = get("program", None)  # what it did on shadows (jit.program.ShadowLog)
        self.sync_at = get("sync_at", None)  # the user's line of the call's last sync
        # The optimizers' settings as the call began ([{key: value}] per param group), the
        # numbers computed from them that the call passed to ops (jit_knobs.attribute), and
        # those that flow into the block: {site: expressions}, filled in by differ (several
        # where settings had equal values: each must give the same number at a replay).
        self.settings: list = get("settings", [])
        self.knob_floats: dict = get("knob_floats", {})
        self.stepped: set = get("stepped", set())  # the optimizers whose step ran (their ids)
        # {identity: place} of the float numbers of its state, the settings' last group
        # (jit.settings.Numbers), and what it tested of them and of the settings (failed)
        self.numbers: dict = get("numbers", {})
        self.tests: list = get("tests", [])
        self.wrote: set = set()  # the places of Python numbers it changed (mutated)
        self.kept: set = get("kept", set())  # settings a number it returned or uploaded came from
        self.flowing: dict = {}
        self.changed: set = set()  # settings (group, key) that differ from the call before
        # (settings, reads) whose Knobs steered Python or left it (jit.settings.steered);
        # {site: expressions} of the numbers sent anew each call (jit.settings.by_origin)
        self.steered: tuple[set, set] = get("steered", (set(), set()))
        self.forced: dict = get("forced", {})
        self.mutated: JitReason | None = None  # a Python value the call changed (mutated)
        self.not_repeated: list[str] = []  # changes a replay will not make (mutated)
        self.schedulers: list = []  # (LR scheduler, steps) it stepped inside (mutated)
        self.rebound: set = get("rebound", set())  # the roots' places bound to other objects
        # An LR scheduler's step ended the block (jit.schedulers): the work the call did
        # after it, in words (None: none), and the values it freed on its way out.
        self.after_scheduler: str | None = get("after_scheduler", None)
        self.late_frees: set = get("late_frees", set())
        if ended:
            raise TypeError(f"a recording has no field {', '.join(ended)}")

    def flows_as(self, other: Recording) -> None:
        """What flows in ``other`` (the recipe's recording) flows here too, changed or not."""
        self.flowing, self.changed = {**other.flowing, **self.flowing}, self.changed | other.changed

    def unreplayable(self) -> JitReason | None:
        if self.after_scheduler is not None:
            return JitReason("after_scheduler", what=self.after_scheduler)
        if self.syncs:
            return JitReason("sync", n=self.syncs, line=_line(self.sync_at))
        if self.reads and (self.program is None or self.program.opaque):
            why = self.program.opaque if self.program is not None else None
            return JitReason("value_read", n=self.reads, what=why)
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
                if a.alias_info is not None and a.alias_info.is_write and refers(v, ids):
                    where = _line(ids[refers(v, ids)])
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
            self._shape = [shape_of(ins) for ins in self.instrs]
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
                for where, v, path in float_args(ins):
                    out.append((ins.op, where, v, (j, path)))
            if ins.code in (OP, FREE):
                j += 1
        return out

    def left_offsets(self) -> dict:
        """{where: storage offset} of the tensors the call returned and left in the state it
        reaches."""
        out = {
            ("result", i): x.gt_meta[3]
            for i, x in enumerate(self.result_leaves)
            if type(x) is Proxy
        }
        out.update((place.ident(), p.gt_meta[3]) for place, p in self.after if type(p) is Proxy)
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
    if len(a.instrs) != len(b.instrs) or a.shape() != b.shape() or not same_path(a, b):
        return None  # other work: the worker sees another block; recording goes on
    b.flowing = {}
    b.changed = {
        (i, key)
        for i, (x, y) in enumerate(zip(a.settings, b.settings, strict=False))  # (groups added)
        for key in y
        if _number(y.get(key)) and x.get(key) != y.get(key)
    }
    what = differs(a.program, b.program, a.settings, b.settings)
    if what is not None:
        return JitReason("value_read", n=b.reads, what=what)
    va, vb = _Values(a), _Values(b)
    for (i, where, x, site), (_, _, y, _) in zip(a.floats(), b.floats(), strict=True):
        if x != y and not _flows(a, b, site, x, y, va, vb):
            return JitReason("python_number", op=str(ops.get(i, i)), arg=where, old=x, new=y)
    _by_origin(a, b, va, vb)
    for (_, _, x, _), (_, _, y, where) in zip(a.puts, b.puts, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype or not torch.equal(x, y):
            return JitReason("host_data_changes", line=_line(where), old=_brief(x), new=_brief(y))
    for x, y in zip(a.result_leaves, b.result_leaves, strict=True):
        if type(x) is not Proxy and x != y:
            return JitReason("python_result", old=x, new=y)
    return None


def offsets(a: Recording, b: Recording) -> tuple[dict | None, JitReason | None]:
    """Where the arguments' storages must begin for a replay: ``b``'s offsets where both
    calls had them alike (the block is known at those alone), None where they differed and
    what the calls left begins where it did (the offsets reach no result); or a reason where
    they differed and a result followed them (a view of an argument returned)."""
    if a.arg_offsets == b.arg_offsets:
        return dict(b.arg_offsets), None
    was, now = a.left_offsets(), b.left_offsets()
    for where, offset in now.items():
        if where in was and was[where] != offset:
            return None, JitReason("follows_offset", old=was[where], new=offset)
    return None, None


def mutated(rec: Recording, settings_after: list, before, after) -> None:
    """What the call changed of the Python state the step reaches, which a replay (no
    Python) would not. An LR scheduler stepped inside the step is known Python: a replay
    steps it as many times after its RUN (``rec.schedulers``), so the settings it changes
    are its. Any other change of an optimizer's setting refuses (``rec.mutated``: the next
    calls would run on stale settings); other Python state changed is listed
    (``rec.not_repeated``: a counter the step keeps). A number the step itself reads and
    changes differs between recorded calls, and is refused there (``differ``)."""
    was = {place.ident(): (place, v) for place, v in before.scalars}
    for place, v in after.scalars:
        old = was.get(place.ident())
        if old is None or (type(old[1]) is type(v) and old[1] == v):
            continue
        what = f"{place.describe()}: {old[1]!r} -> {v!r}"
        rec.wrote.add(place.ident())
        if isinstance(place.obj, torch.optim.lr_scheduler.LRScheduler):
            plateau = isinstance(place.obj, torch.optim.lr_scheduler.ReduceLROnPlateau)
            if plateau or type(v) is not int or v <= old[1]:
                rec.mutated = JitReason("mutates", place=place.describe(), what=what)
                return
            rec.schedulers.append((place.obj, v - old[1]))
        else:
            rec.not_repeated.append(what)
    if rec.schedulers:
        return
    for i, (x, y) in enumerate(zip(rec.settings, settings_after, strict=False)):
        for key, v in y.items():
            if key not in ("params", "capturable") and _number(v) and x.get(key) != v:
                what = f"group {i} {key}: {x.get(key)!r} -> {v!r}"
                rec.mutated = JitReason("mutates", place="an optimizer's setting", what=what)
                return


def same_path(a: Recording, b: Recording) -> bool:
    """Whether two calls' Python could have taken one path: each call's tests of its numbers
    (jit.settings.failed) come out alike with the other's, and they began with the same ints
    and bools in the state (what Python did with those is not followed: see guards). Two
    calls that took other paths are no pair: recording goes on."""
    if failed(b.tests, a.settings, _reads(a)) is not None:
        return False
    if failed(a.tests, b.settings, _reads(b)) is not None:
        return False
    was = {place.ident(): v for place, v in a.scalars if type(v) is not float}
    wrote = a.wrote | b.wrote
    for place, v in b.scalars:
        ident = place.ident()
        if type(v) is float or ident in wrote or ident not in was:
            continue
        if type(was[ident]) is not type(v) or was[ident] != v:
            if not isinstance(place.obj, torch.optim.lr_scheduler.LRScheduler):
                return False
    return True


def guards(a: Recording, b: Recording, flowing=frozenset()) -> list:
    """[(place, value)] the recipe of ``b`` compares before each replay besides settings, as
    ``b`` began: every int and bool the step reaches (a module's ``training`` flag, a count
    of micro-batches), since what Python does with one cannot be followed (C reads it:
    ``range(n)``, a shape); and each float a number the block holds as recorded came from
    (``x * cfg["scale"]``, a number returned or uploaded). A float otherwise is followed as
    a Knob (jit.settings): tested (its outcome is checked) or unread. Not those that flow
    (``flowing``: read anew each replay), those a recorded call changed itself (a counter it
    keeps: ``Recording.not_repeated``), nor an LR scheduler's count of steps: the loop steps
    it, and what it computes reaches the step as the optimizers' settings."""
    wrote = a.wrote | b.wrote
    numbers = len(b.settings) - 1 if b.numbers else None
    used = {s for es in b.knob_floats.values() for e in es for s in settings_in(e)} | b.kept
    out = []
    for place, v in b.scalars:
        if isinstance(place.obj, torch.optim.lr_scheduler.LRScheduler):
            continue  # (known Python: what it does reaches the step as settings, see mutated)
        ident = place.ident()
        if ident in wrote or (numbers, ident) in flowing:
            continue
        if ident in b.numbers and (numbers, ident) not in used:
            continue
        out.append((place, v))
    return out


def _number(v) -> bool:
    """A setting that can flow: a float, or a tuple of them (betas); never compared as a
    tensor (that would be a sync)."""
    return type(v) is float or (type(v) is tuple and all(type(x) is float for x in v))


class _Values(dict):
    """The number each expression gives in one recorded call (``agree`` of it alone),
    computed once: an optimizer's expressions repeat for every parameter."""

    def __init__(self, rec: Recording):
        super().__init__()
        self.groups, self.reads = rec.settings, _reads(rec)

    def __missing__(self, expr):
        v = self[expr] = agree((expr,), self.groups, self.reads)
        return v


def _flows(a: Recording, b: Recording, site, x: float, y: float, va, vb) -> bool:
    """Whether the number at ``site`` (``x`` in call ``a``, ``y`` in ``b``) is an expression
    of each call's optimizer settings; if so, it flows (``b.flowing``). Every expression that
    gives both numbers is kept (two param groups with one lr: either could be the origin), and
    a replay sends the number only while they all agree (``settings.agree``)."""
    exprs = _unwritten(a, b, b.knob_floats.get(site, ()))
    found = tuple(e for e in exprs if va[e] == x and vb[e] == y)
    if found:
        b.flowing[site] = found
    return bool(found)


def _by_origin(a: Recording, b: Recording, va, vb) -> None:
    """The numbers ``b`` passed inside its optimizers' steps that flow by their origin
    (``b.forced``) though both calls passed the same: kept in ``b.flowing`` with the
    expressions that gave them on both calls."""
    values = {site: v for _, _, v, site in a.floats()}
    for _, _, y, site in b.floats():
        exprs = b.forced.get(site)
        if not exprs or site in b.flowing or site not in values:
            continue
        found = tuple(e for e in _unwritten(a, b, exprs) if va[e] == values[site] and vb[e] == y)
        if found:
            b.flowing[site] = found


def _unwritten(a: Recording, b: Recording, exprs) -> tuple:
    """Those of ``exprs`` that read no number a recorded call changed itself: a replay does
    not repeat the change (``scale[0] *= 2`` in the step), so such a number cannot flow."""
    wrote = a.wrote | b.wrote
    if not wrote:
        return tuple(exprs)
    numbers = len(b.settings) - 1
    return tuple(e for e in exprs if not any((numbers, w) in settings_in(e) for w in wrote))


def _reads(rec: Recording) -> list:
    return rec.program.reads if rec.program is not None else []


def _line(where) -> str | None:
    return f"{where[0]}:{where[1]}" if where else None


def _brief(t) -> str:
    if t.numel() <= 4:
        return str(t.tolist())
    return f"{list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
