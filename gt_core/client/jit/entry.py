"""One call key of a jitted function: its state machine.

The states and the transitions between them are ``gt_core.observe.jit_states``' table; this
class moves only through :meth:`Entry.move`, which applies that table and emits the event
(its state, trigger and typed reason) that the report folds. What each state does with a
call:

* recording / re-recording: the call runs its Python, recorded between marks; once the last
  two recorded calls made one block and the worker sent its plan, the key replays (or is
  refused, with the reason the recorded calls show);
* replaying: before each call the settings the block holds are compared; a call sends one
  RUN (``replay``), except an audited one, recorded instead and compared with the replay it
  stands for (``audit``);
* refused: the call runs its Python, unrecorded by jit.
"""

from __future__ import annotations

import collections
import time

from torch.utils._pytree import tree_flatten

from gt_core.client import collector
from gt_core.client.jit import audit, replay
from gt_core.client.jit.knob import Knob, agree, failed, settings_in, steered
from gt_core.client.jit.program import Rerun, ShadowLog
from gt_core.client.jit.reach import reach_roots, walk
from gt_core.client.jit.recipe import Recipe
from gt_core.client.jit.recording import (
    Recording,
    Refused,
    differ,
    guards,
    mutated,
    offsets,
    same_path,
)
from gt_core.client.jit.schedulers import End, outside
from gt_core.client.jit.settings import (
    Numbers,
    attribute,
    by_origin,
    groups,
    knobs,
    live,
    numbers_at,
    wrapped,
)
from gt_core.client.jit.traced import as_traced
from gt_core.client.recording.proxy import Proxy
from gt_core.client.session import LOCK
from gt_core.client.session_stats import jit_stats
from gt_core.observe import events as ev
from gt_core.observe import metrics
from gt_core.observe.jit_states import JitReason, JitState, Trigger, next_state
from gt_core.stream.instructions import JIT_SIGNAL, MARK, Mark, op_name
from gt_core.stream.requests import JitPlan

__all__ = ["Entry", "RECORD_LIMIT"]

RECORD_LIMIT = 6  # recorded calls of one key without a repeatable block: replay refused
_RECORDS = (JitState.RECORDING, JitState.RERECORDING)


class Entry:
    """One call key: recorded calls until their block repeats, then replayed calls."""

    def __init__(self, owner, session, k: int):
        self.owner = owner
        self.session = session
        self.name = f"{JIT_SIGNAL}{owner.name}:{id(owner):x}:{k}"
        self.state = JitState.RECORDING
        self.reason: JitReason | None = None  # why the key left its last state
        self.recorded: list[Recording] = []
        self.recipe: Recipe | None = None
        self.replayed = 0
        self.audited = 0  # replays recorded instead and compared (see audit)
        self.since_prepared = 0  # replays since the recipe was made
        self.scalars_now: list = []  # the block's lifted numbers for this call (see _stale)
        self.rerun: Rerun | None = None  # its reads from shadows, to commit once sent
        self.client_ms: collections.deque = collections.deque(maxlen=metrics.CLIENT_SAMPLES)
        self.marks: collections.deque = collections.deque()
        self.calls = 0  # recorded calls since recording (re)started
        session.jits.append(self)
        self.sig: str | None = None  # the block's signature, once the worker has it
        self.facts: list | None = None  # (session, metadata key, shadow) per fitting input
        collector.set_aside()  # a step's first call: its model and data are long-lived

    stats = jit_stats  # its replays and audits, the client's ms per replay (as reported)

    @property
    def refused(self) -> str | None:
        """Why replay is refused (None: it is not)."""
        return self.reason.text() if self.state is JitState.REFUSED else None

    def call(self, leaves, spec):
        if self.state in _RECORDS and len(self.recorded) >= 2:
            self._prepare()
        if self.state is JitState.REPLAYING:
            why = self._stale(leaves)
            if why is not None:
                self.move(Trigger.SETTING_CHANGED, why)
        if self.state is JitState.REPLAYING:
            if audit.due(self):
                return audit.run(self, leaves, spec)
            t0 = time.perf_counter()
            out = replay.run(self, leaves)
            if out is not replay.UNFIT:
                t1 = time.perf_counter()
                replay.bound(self)  # (waiting for the worker: not the client's own time)
                self.client_ms.append((t1 - t0) * 1e3)
                return out
        if self.state is JitState.REFUSED:
            args, kwargs = replay.unflatten(leaves, spec)
            return self.owner.fn(*args, **kwargs)
        result, rec = self.record(leaves, spec)
        self.keep(rec)
        return result

    # -- the table ------------------------------------------------------------------------
    def move(self, trigger: Trigger, reason: JitReason | None = None, **facts) -> None:
        """Take the transition ``trigger`` from the current state (the table's), and say so."""
        state = next_state(self.state, trigger)
        self.state, self.reason = state, reason or self.reason
        if state is not JitState.REPLAYING:
            self.recipe, self.facts = None, None
        if state is JitState.RERECORDING:
            # The last recorded call stays: the next one is compared with it, so a setting
            # that changed between them (a scheduler's step) flows into the block from then.
            self.recorded, self.calls = self.recorded[-1:], 0  # (its record limit starts over)
        self.session.log.emit(
            ev.JIT,
            function=self.owner.name,
            name=self.name,
            state=str(state),
            trigger=str(trigger),
            signature=self.sig,
            reason=reason.text() if reason is not None else None,
            cause=reason.to_data() if reason is not None else None,
            **facts,
        )

    # -- recording ---------------------------------------------------------------------
    def record(self, leaves, spec):
        """Run the call's Python, recorded between marks: (its result, its Recording)."""
        s = self.session
        args, kwargs = replay.unflatten(leaves, spec)
        roots = reach_roots(self.owner.fn, leaves)
        filled = replay.fill_grads(self.recorded[-1]) if self.recorded else []
        with LOCK:
            s.flush()
            reached = walk(roots)  # (after the flush: the slots as they are now)
            opts = reached.optimizers
            places = numbers_at(reached.scalars)  # (the step's own float numbers)
            settings, ledger, steer, tests = [dict(g) for g in groups(opts)], {}, set(), []
            if places:
                settings.append(Numbers((k, p.read()) for k, p in places.items()))
            syncs, reads = s.counters["syncs"], s.counters["shadow_reads"]
            s.emit(Mark(MARK, self.name, "enter"))
            tee, puts, log = [], [], ShadowLog(Proxy)
            s.record_into(tee, puts, log)
        spans, stepped = [], set()  # (the optimizers' steps among the instructions; their ids)
        end = End(s, self.name, lambda: by_origin(tee, ledger, spans, steer))  # (or a scheduler)
        try:
            traced = as_traced(spans, lambda: len(tee), stepped)
            knobs_ = wrapped(opts, ledger, steer, places, tests)
            with traced, knobs_, outside(reached.schedulers, end):
                result = self.owner.fn(*args, **kwargs)
        except BaseException:
            replay.unfill_grads(filled, tee)  # (the call raised: its grads as eager left them)
            raise
        finally:
            end.close()
        now = [(p, obj if p is None else p.read()) for p, obj in roots]  # (rebound too)
        after = walk(now)
        instrs = tee[:-1]
        replay.unfill_grads(filled, instrs)
        pairs = zip(roots, now, strict=True)
        syncs = end.counted["syncs"] - syncs
        kept = _steer_kept(steer, result, puts, ledger)
        log.ended(ledger, steered(steer))
        knob_floats = attribute(instrs, ledger)
        rec = Recording(
            *(leaves, roots, reached, after.slots, result, instrs, puts),
            rebound={p.ident() for (p, was), (_, obj) in pairs if p and obj is not was},
            syncs=syncs,
            reads=end.counted["shadow_reads"] - reads,
            after_scheduler=end.after() or end.read_after(spans, knob_floats, instrs),
            late_frees=end.late_frees(),
            kept=kept,
            steered=log.steered,
            forced=end.origin,
            program=log,
            sync_at=s.matcher.lines.last.get("syncs") if syncs else None,
            settings=settings,
            knob_floats=knob_floats,
            numbers=places,
            tests=list(dict.fromkeys(tests)),
            stepped=stepped,
        )
        log.bind(rec.before, leaves, rec.puts)
        mutated(rec, [dict(g) for g in groups(opts)], reached, after)
        return result, rec

    def keep(self, rec: Recording) -> None:
        """A recorded call becomes the newest of the two a recipe is made from."""
        self.recorded = [*self.recorded[-1:], rec]
        self.calls += 1
        if self.calls >= RECORD_LIMIT and self.state in _RECORDS:
            self.move(Trigger.REFUSED, JitReason("no_block", n=self.calls))

    def _prepare(self) -> None:
        """Turn the last two recorded calls into a recipe, once the worker sent the plan."""
        a, b = self.recorded[-2], self.recorded[-1]
        ops = {idx: op_name(op) for op, idx in self.session.op_index.items()}
        why = (
            b.unreplayable()
            or differ(a, b, ops)
            or b.mutated
            or b.written_constant(self.session.op_index)
        )
        if why is not None:
            self.move(Trigger.REFUSED, why)
            return
        if len(a.instrs) != len(b.instrs) or a.shape() != b.shape() or not same_path(a, b):
            return  # other work each call so far: recording goes on
        at, why = offsets(a, b)
        if why is not None:
            self.move(Trigger.REFUSED, why)
            return
        got = self.session.request(JitPlan(self.name))  # once per key
        if got is None:
            return  # the worker saw two blocks (other input metadata): recording goes on
        self.sig, plan = got
        self.facts = None
        try:
            recipe = Recipe(plan, b, before=a)
        except Refused as exc:
            self.move(Trigger.REFUSED, exc.reason)
            return
        recipe.guarded(guards(a, b, recipe.flowing), at)
        self.since_prepared = 0
        self.move(
            Trigger.PREPARED,
            frozen=b.frozen(ops),
            constants=b.constants(),
            not_repeated=b.not_repeated,  # Python state the call changed, a replay will not
            flowing=recipe.flowing_names(),  # settings and numbers sent each call
            inputs=len(recipe.inputs),
            outputs=len(recipe.outputs),
        )
        self.recipe = recipe

    # -- before a replay ------------------------------------------------------------------
    def _stale(self, leaves) -> JitReason | None:
        """Why the block no longer holds the step's settings (None: it does)."""
        r = self.recipe
        self.rerun, reads = None, ()
        now = live(r.optimizers, r.numbers)
        if r.program is not None:  # (the values the step reads from shadows, read again)
            rerun = Rerun(r.program, leaves, now)
            if rerun.reads is None:
                what = "not known here (its client copy was let go)"
                return JitReason(
                    "value_changed", place="a small tensor the step reads", old="known", new=what
                )
            for j, was in r.compared_reads:
                if rerun.reads[j] != was:
                    place = "a value the step reads from a small tensor"
                    return JitReason("value_changed", place=place, old=was, new=rerun.reads[j])
            self.rerun, reads = rerun, rerun.reads
        for get, obj, key, was, place in r.guards:
            try:
                v = get(obj, key)
            except (AttributeError, KeyError, IndexError):
                v = None
            if type(v) is not type(was) or v != was:
                return JitReason("value_changed", place=place.describe(), old=was, new=v)
        compared = knobs(r.optimizers, r.flowing, only=r.only)
        if r.knobs != compared:
            return _changed(r.knobs, compared)
        values = [agree(es, now, reads) for es in r.distinct]
        if None in values:  # settings that were equal when recorded (two groups' lr) differ
            es = r.distinct[values.index(None)]
            was = sorted({f"group {g} {k}" for e in es for g, k in settings_in(e)})
            return JitReason("settings_parted", arg=" / ".join(was))
        what = failed(r.tests, now, reads)
        if what is not None:
            return JitReason("test_flips", what=what)
        self.scalars_now = [values[i] for i in r.scalar_ix]
        return None

    def ran(self, audited: bool = False) -> None:
        """A replay stood for this call: its RUN sent, or (``audited``) recorded instead."""
        if audited:
            self.audited += 1
        else:
            self.replayed += 1
        self.since_prepared += 1

    def fitted(self, facts: list) -> None:
        """The call's inputs fit: their facts, what the next call checks first (replay's)."""
        self.facts = facts

    def unfit(self, src, p, k, what: str | None = None) -> None:
        """An input no longer fits the block: the call runs, recording starts over."""
        where = f"argument {src}" if type(src) is int else src.describe()
        if what is not None:
            got = what
        elif k is None:
            got = "it now holds another object"
        else:
            got = "not a worker tensor" if not hasattr(p, "gt_meta") else f"metadata {p.gt_meta}"
        self.move(Trigger.UNFIT, JitReason("unfit", place=where, what=got))


_SMALL_HOST = 64  # host tensors searched for a setting's number (a torch.tensor(lr), a few betas)


def _steer_kept(steer: set, result, puts: list, ledger: dict) -> set:
    """Numbers computed from settings that a replay would keep as recorded, not sent anew:
    one the step returns (a Knob), one a tensor made from host data holds (a small
    ``torch.tensor(lr)``). Their settings and reads are steered (see settings.steered); the
    settings (group, key) they read are returned."""
    kept = set()
    for x in tree_flatten(result)[0]:
        if type(x) is Knob:
            kept.add(x.expr)
    for _, _, host, _ in puts:
        if host is not None and host.numel() <= _SMALL_HOST and host.is_floating_point():
            for v in host.flatten().tolist():
                kept.update(ledger.get(v, ()))
    steer |= kept
    return set().union(*map(settings_in, kept))


def _changed(was: list, now: list) -> JitReason:
    """The first setting that differs between two ``knobs`` lists, as a reason."""
    for i, (x, y) in enumerate(zip(was, now, strict=False)):
        for (k, a), (k2, b) in zip(x, y, strict=False):
            if k != k2 or a != b:
                return JitReason("setting_changed", arg=f"group {i} {k}", old=a, new=b)
    return JitReason("setting_changed", arg="param groups", old=len(was), new=len(now))
