"""A jitted step's recipe: what a replayed call reads where, and leaves where.

Two recorded calls alike (``recording``) and the worker's plan of their block make a
``Recipe``: the block's inputs as places in the step's reachable state (or its arguments),
its outputs as the places the recorded call left them in (see ``reach``).
"""

from __future__ import annotations

from gt_core.client.jit.knob import settings_in
from gt_core.client.jit.program import reads_in
from gt_core.client.jit.reach import Place, ids_by_place
from gt_core.client.jit.recording import Recording, Refused
from gt_core.client.jit.settings import knobs, touched
from gt_core.client.plans.plan_match import Candidate
from gt_core.client.recording.proxy import Proxy
from gt_core.observe.jit_states import JitReason
from gt_core.stream.instructions import FREE, PUT
from gt_core.stream.lift import Scalar

__all__ = ["Recipe", "Recording", "Refused", "OUT"]

OUT = "gt-jit-output"  # a result leaf that is the block's output (OUT, its index)


class Recipe:
    """What a replayed call does: where each input is read, where each output goes; made
    from recorded call ``rec`` (and ``before``, the one before it: the settings either
    touched are compared)."""

    def __init__(self, plan, rec: Recording, before: Recording | None = None):
        occ = _matched(plan, rec)
        self.plan, self.rec = plan, rec  # (what an audited call is compared with)
        self.sig = plan.sig
        # A global or closure name the step binds anew (an LSTM's hidden state, x = f(x)) is
        # an output place, not a root whose object must stay (see _rebound).
        # A number is no root whose object must stay: it is compared by value (guards) or
        # read anew (a number that flows).
        self.roots = [
            (p, obj)
            for p, obj in rec.roots
            if p.ident() not in rec.rebound and type(obj) not in (int, float, bool)
        ]
        self.n_produced = len(occ.produced)
        self._find_inputs(occ, rec)
        self.input_ids = list(occ.inputs)  # (the value ids the recorded call's block read)
        self._outputs(occ, rec)
        self._rebound(rec)
        # What a replayed call reads, flat: (getter, container, key) per input (the getter
        # None for an argument: leaves[key]), each one's metadata key, and the roots the same
        # way (see _Entry._replay's fast path).
        self.readers = [
            (None, None, src) if type(src) is int else src.reader() for src, _ in self.inputs
        ]
        self.keys = [k for _, k in self.inputs]
        self.root_readers = [place.reader() for place, _ in self.roots]
        self.root_objs = [obj for _, obj in self.roots]
        self._seen(rec)
        # The optimizers the step can reach, and their settings now: the block holds them as
        # numbers, so a change (an LR scheduler's step) means recording again.
        self.optimizers = rec.optimizers
        self.guards: list = []  # (getter, obj, key, value, place): compared (see guarded)
        # {argument: storage offset} each replay's arguments must begin at (None: anywhere;
        # recording.offsets)
        self.arg_offsets: dict | None = None
        self.schedulers = rec.schedulers  # (LR scheduler, steps) a replay steps after its RUN
        # The block's lifted numbers, each the expressions of those settings that gave it
        # (jit.settings); the settings that changed between the recorded calls flow, the
        # others stay compared. A replay evaluates each distinct set of expressions once.
        scalars, self.scalar_sites = _scalar_exprs(plan, rec)
        self.distinct = list(dict.fromkeys(scalars))
        at = {e: k for k, e in enumerate(self.distinct)}
        self.scalar_ix = [at[e] for e in scalars]
        changed = {
            s for es in self.distinct for e in es for s in settings_in(e) if s in rec.changed
        }
        self.flowing = frozenset(changed | _by_origin(rec, set(self.scalar_sites)))
        # (as the recorded call began: a scheduler it stepped has changed them since)
        self.only = touched(self.optimizers, (rec,) if before is None else (before, rec))
        self.knobs = knobs(self.optimizers, self.flowing, rec.settings, self.only)
        # The numbers of the step's state (jit.settings.Numbers) a replay reads, and what
        # the recorded call tested of them and of the settings (checked: knob.failed).
        self.numbers = rec.numbers
        self.tests = rec.tests
        self._reads(rec)

    def _reads(self, rec: Recording) -> None:
        """The values the call read from shadows (jit.program): a replay reads them again by
        running the call's log; those no flowing number is computed from (in the block or in
        the log's own ops), and those that steered Python, are compared."""
        log = rec.program
        self.program = log if log is not None and log.reads else None
        used = {j for es in self.distinct for e in es for j in reads_in(e)}
        if self.program is not None:
            logged = [es for sites in log.flowing.values() for _, es in sites]
            used |= {j for es in logged for e in es for j in reads_in(e)}
            used -= log.steered[1]
        reads = log.reads if self.program is not None else []
        self.compared_reads = [(j, v) for j, v in enumerate(reads) if j not in used]

    def guarded(self, kept: list, arg_offsets: dict | None) -> None:
        """What a replay checks first: the Python values ``kept`` ((place, value) each:
        recording.guards) and where its arguments' storages begin (recording.offsets)."""
        self.guards = [(*place.reader(), v, place) for place, v in kept]
        self.arg_offsets = arg_offsets

    def flowing_names(self) -> list[str]:
        """The settings and numbers sent with each replay, in words."""
        return sorted(
            key if type(key) is str else self.numbers[key].describe() for _, key in self.flowing
        )

    def _outputs(self, occ: Candidate, rec: Recording) -> None:
        """``outputs``: (index among the produced values, metadata) of each the block leaves
        alive, put where the recorded call put it (``placed``, ``result``)."""
        freed = {ins.vid for ins in rec.instrs if ins.code == FREE}
        alive = [k for k, vid in enumerate(occ.produced) if vid not in freed]
        index = {occ.produced[k]: j for j, k in enumerate(alive)}
        metas: dict[int, tuple] = {}  # value id -> metadata, of each output put somewhere
        self._place_outputs(rec, index, metas)
        self._result(rec, index, metas)
        # Outputs the call freed as it returned, after the block ended at an LR scheduler's
        # step (jit.schedulers): a replay frees them after its RUN (their metadata None).
        late = {occ.produced[k] for k in alive} & rec.late_frees
        missing = [vid for k in alive if (vid := occ.produced[k]) not in metas and vid not in late]
        if missing:
            raise Refused(JitReason("kept_alive", n=len(missing)))
        self.outputs = [(k, metas.get(occ.produced[k])) for k in alive]
        self.let_go = [k for k, meta in self.outputs if meta is None]

    def _seen(self, rec: Recording) -> None:
        """``seen``: the other tensor slots the step reaches, as the recorded call found them:
        empty (a .grad before backward) or a tensor of some metadata the Python could read (a
        shape). Another there at a replay is state the recorded Python did not see (backward
        adds to a .grad it finds), so the call runs instead."""
        read = {place.ident() for place, _ in self.inputs if type(place) is not int}
        seen: dict = {}
        for place, p in rec.before:
            if place.ident() not in read:
                seen.setdefault(place.ident(), (place, None if p is None else p.gt_meta_key))
        self.seen = list(seen.values())
        self.seen_readers = [place.reader() for place, _ in self.seen]
        self.seen_keys = [k for _, k in self.seen]
        # A slot that held an input's tensor holds that same tensor (an optimizer's param
        # and the module's: a parameter rebound on the module alone parts them), and each
        # container on the way to a slot is still where the walk found it (an optimizer's
        # state cleared or loaded, a submodule replaced: the places above would be stale).
        at = {vid: i for i, vid in enumerate(self.input_ids)}
        written = {place.ident() for place, _ in self.placed} | read
        self.aliases = [
            (place.reader(), at[p.gt_value_id], place)
            for place, p in rec.before
            if p is not None and p.gt_value_id in at and place.ident() not in written
        ]
        holders: dict = {}
        for place, obj in rec.holders:
            holders.setdefault(place.ident(), (place, obj))
        self.holders = list(holders.values())
        self.holder_readers = [place.reader() for place, _ in self.holders]
        self.holder_objs = [obj for _, obj in self.holders]

    def _rebound(self, rec: Recording) -> None:
        """Each name the step binds anew must be one a replay binds too: to an output (a
        tensor), or to a tuple of outputs made anew (refused otherwise: a replay would leave
        the old object there)."""
        placed = {p.ident() for p, _ in self.placed}
        for place, _ in rec.roots:
            if place.ident() not in rec.rebound:
                continue
            now = place.read()
            if isinstance(now, Proxy):
                ok = place.ident() in placed
            else:
                ok = isinstance(now, tuple) and all(
                    Place("elem", place, i).ident() in placed
                    for i, x in enumerate(now)
                    if isinstance(x, Proxy)
                )
            if not ok:
                what = f"{place.describe()} bound to another {type(now).__name__}"
                raise Refused(JitReason("mutates", place=place.describe(), what=what))

    def _find_inputs(self, occ: Candidate, rec: Recording) -> None:
        """``inputs``: per block input, (its place or argument index, its metadata key)."""
        before = {}
        for place, p in rec.before:
            if p is not None:
                before.setdefault(p.gt_value_id, (place, p))
        self.inputs = []
        # The tensors made from host data (equal on the recorded calls): kept alive here, and
        # read from here by every replay.
        self.constants = [p for _, p, _, _ in rec.puts]
        made = {vid: j for j, (vid, _, _, _) in enumerate(rec.puts)}
        for vid in occ.inputs:
            if vid in made:
                p = self.constants[made[vid]]
                self.inputs.append((Place("item", self.constants, made[vid]), p.gt_meta_key))
            elif vid in rec.arg_ids:
                i = rec.arg_ids[vid]
                self.inputs.append((i, rec.arg_keys[i]))
            elif vid in before:
                place, p = before[vid]
                self.inputs.append((place, p.gt_meta_key))
            else:
                raise Refused(JitReason("unreachable"))

    def _place_outputs(self, rec: Recording, index: dict, metas: dict) -> None:
        """``placed``: (place, output) the recorded call left there; ``cleared``: places it
        emptied."""
        self.placed, self.cleared = [], []
        places_after = {place.ident(): (place, p) for place, p in rec.after}
        ids_before = ids_by_place(rec.before)
        for key, (place, p) in places_after.items():
            was = ids_before.get(key)
            now = p.gt_value_id if p is not None else None
            if was == now:
                continue
            if now is None:
                self.cleared.append(place)
            elif now in index:
                self.placed.append((place, index[now]))
                metas[now] = p.gt_meta
            else:
                raise Refused(JitReason("moves_tensor", place=place.describe()))

    def _result(self, rec: Recording, index: dict, metas: dict) -> None:
        """``result``: the call's result leaves, outputs as (OUT, output); ``single``: the one
        output when the result is that tensor alone (returned without pytree)."""
        self.result_spec = rec.result_spec
        self.result = []
        for x in rec.result_leaves:
            if type(x) is Proxy:
                if x.gt_value_id not in index:
                    raise Refused(JitReason("returns_input"))
                self.result.append((OUT, index[x.gt_value_id]))
                metas[x.gt_value_id] = x.gt_meta
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


def _by_origin(rec: Recording, lifted: set) -> set:
    """The settings that flow by their origin (jit.settings.by_origin) though they did not
    change: each number computed from one is lifted into the block (at ``lifted``), and none
    steered Python or left its Knob. One number of it the block holds as recorded (an op
    outside the optimizer's step passed its value, or a site that could not be lifted) keeps
    the setting compared."""
    out = {
        s for site, es in rec.forced.items() if site in lifted for e in es for s in settings_in(e)
    }
    for site, es in rec.knob_floats.items():
        if site not in lifted:
            out -= {s for e in es for s in settings_in(e)}
    return out - rec.steered[0]


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
