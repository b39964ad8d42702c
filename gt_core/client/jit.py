"""``gt_core.jit``: once a step is known, a call sends one message instead of running its Python.

Inside ``capture()`` (or a ``%%gt`` cell), a call of a jitted function is first recorded as
any code is, with marks around it, so the worker sees exactly the call as one block. Once two
recorded calls with the same key (its tensor arguments' metadata, its other arguments'
values) made the same block, and the worker has sent that block's plan, a call no longer
runs the function: it reads the block's inputs where the recorded call found them (its
arguments, parameters, their ``.grad``, optimizer state), sends one RUN, and puts proxies for
the block's outputs where the recorded call left them (its result, ``.grad``, optimizer
state). The worker runs the block compiled (eagerly until its compile is done).

Recorded calls run library code as torch.compile traces it: ``torch.compiler.is_compiling()``
is true (optimizers compute Adam's bias corrections as tensor ops; ``transformers`` skips
its data-dependent checks), and the step's optimizers are ``capturable`` while it records
(restored after): the block then reads the step count, not a new Python number per call.

Contract (what a replayed call does not repeat)
  * Tensors flow, and so do the float settings of the optimizers the step reaches (``lr``,
    betas, weight decay) that changed between the two recorded calls: the numbers the step
    computed from them by arithmetic become inputs of the block, and a replayed call sends
    them computed from the settings as they are now (``jit_knobs``; a per-step LR schedule
    replays). Other Python values the step reads are frozen as the recorded calls had them;
    where they differ between recorded calls, replay is refused with the op and the values,
    and the function keeps running (compiled as any hot path). The settings that do not
    flow are compared before every replay: after a change (a StepLR's step) the function
    records one call again, compared with the last one recorded, so a frozen setting is
    never replayed stale and the changed one flows from then on.
  * Tensors the step makes from host data (``torch.tensor([...])``, a cache's empty
    tensors) are frozen into the block when equal on the recorded calls, and listed with
    the line that made them; one that differs is data: replay is refused naming that line.
  * Python side effects are not repeated: prints, appends to lists, attributes other than
    the tensor state above, Python's own random numbers.
  * A sync inside the step (``.item()``, printing a tensor, data-dependent shapes) refuses
    replay: the step needs its Python.
  * Tensors the step reads must be reachable from its arguments, closure or globals (its
    own, or those of the Python functions it calls, three levels deep) through tensors,
    modules, optimizers, LR schedulers, dicts, lists, tuples and the attributes of
    plain objects (a KV cache and its layers); outputs the same.
  * Outputs of a replayed call are detached (no autograd graph leads to them).
Never a wrong replay: an input that no longer fits (a parameter replaced, its metadata
changed) runs the function instead, with the reason as an event; the worker checks each
RUN's inputs against the block as well.
"""

from __future__ import annotations

import collections
import functools
import operator
import statistics
import time
import types

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from gt_core.client import capture as _capture
from gt_core.client.jit_knobs import attribute, evaluate, groups, wrapped
from gt_core.client.jit_places import reach_roots, tensor_slots
from gt_core.client.jit_recipe import OUT, Recipe, Recording, Refused, differ
from gt_core.client.jit_traced import as_traced, knobs, optimizers
from gt_core.client.proxy import Proxy
from gt_core.client.session import LOCK
from gt_core.client.uploads import upload
from gt_core.observe import events as ev
from gt_core.observe import metrics
from gt_core.stream.instructions import FREE, JIT_SIGNAL, MARK, RUN, Free, Mark, Run, op_name
from gt_core.stream.requests import JitPlan

__all__ = ["jit", "Jit"]

RECORD_LIMIT = 6  # recorded calls of one key without a repeatable block: replay refused
IN_FLIGHT = 32  # replayed calls the worker may be behind by before a call waits for it
_MARK_EVERY = 8  # a progress mark is posted every this many replayed calls


def jit(fn=None):
    """Replay ``fn``'s block once two calls recorded it alike (see the module's contract).

    In [1]: @gt_core.jit
       ...: def step(x, y):
       ...:     loss = F.mse_loss(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
       ...:     return loss
    """
    if fn is None:
        return jit
    return functools.wraps(fn)(Jit(fn))


class Jit:
    """A jitted function: a cache of one entry per call key (see :class:`_Entry`)."""

    def __init__(self, fn):
        self.fn = fn
        self.name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        self.entries: dict = {}

    def __get__(self, obj, cls=None):  # a jitted method binds like a function
        return self if obj is None else types.MethodType(self, obj)

    def __call__(self, *args, **kwargs):
        s = _capture.current_session()
        if s is None:  # outside a capture: an ordinary call
            return self.fn(*args, **kwargs)
        if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
            leaves, spec = list(args), len(args)  # the common case, without pytree
            if not all(type(a) is Proxy for a in leaves):  # (a host batch: uploaded)
                with LOCK:
                    leaves = [a if type(a) is Proxy else upload(Proxy, s, a) for a in leaves]
        else:
            leaves, spec = tree_flatten((args, kwargs))
            with LOCK:
                leaves = [upload(Proxy, s, x) if _plain_tensor(x) else x for x in leaves]
        key = _key(leaves, spec)
        if key is None:
            return self.fn(*args, **kwargs)  # an argument that cannot be a key: no cache
        entry = self.entries.get(key)
        if entry is None or entry.session is not s:
            entry = self.entries[key] = _Entry(self, s, len(self.entries))
        return entry.call(leaves, spec)

    def __repr__(self) -> str:
        return f"<gt_core.jit of {self.name}: {len(self.entries)} key(s)>"


def _plain_tensor(x) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, Proxy)


def _unflatten(leaves, spec):
    """(args, kwargs) from ``_key``'s leaves: ``spec`` is a pytree spec, or the number of
    proxies passed positionally (the common case, flattened without pytree)."""
    if type(spec) is int:
        return tuple(leaves), {}
    return tree_unflatten(leaves, spec)


def _key(leaves, spec):
    parts = [spec]
    for x in leaves:
        if type(x) is Proxy:
            parts.append((x._gt_k, x.requires_grad))
        else:
            parts.append((type(x), x))
    key = tuple(parts)
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Entry:
    """One call key: recorded calls until their block repeats, then replayed calls."""

    def __init__(self, owner: Jit, session, k: int):
        self.owner = owner
        self.session = session
        self.name = f"{JIT_SIGNAL}{owner.name}:{id(owner):x}:{k}"
        self.recorded: list[Recording] = []
        self.recipe: Recipe | None = None
        self.refused: str | None = None
        self.replayed = 0
        self.client_ms: collections.deque = collections.deque(maxlen=metrics.CLIENT_SAMPLES)
        self.marks: collections.deque = collections.deque()
        self.calls = 0  # recorded calls
        session.jits.append(self)
        self.sig: str | None = None  # the block's signature, once the worker has it
        self.facts: list | None = None  # (session, metadata key, no shadow) per fitting input

    def call(self, leaves, spec):
        if self.refused is None and self.recipe is None and len(self.recorded) >= 2:
            self._prepare()
        r = self.recipe
        if r is not None and r.knobs != knobs(r.optimizers, r.flowing):
            self._retune()
        if self.recipe is not None:
            t0 = time.perf_counter()
            out = self._replay(leaves)
            if out is not _UNFIT:
                t1 = time.perf_counter()
                self._bound()  # (waiting for the worker: not the client's own time)
                self.client_ms.append((t1 - t0) * 1e3)
                return out
        if self.refused is not None:
            args, kwargs = _unflatten(leaves, spec)
            return self.owner.fn(*args, **kwargs)
        return self._record(leaves, spec)

    # -- recording ---------------------------------------------------------------------
    def _record(self, leaves, spec):
        s = self.session
        args, kwargs = _unflatten(leaves, spec)
        roots = reach_roots(self.owner.fn, leaves)
        opts = optimizers(obj for _, obj in roots)
        settings, ledger = [dict(g) for g in groups(opts)], {}
        with LOCK:
            s.flush()
            before = tensor_slots(roots)
            syncs = s.counters["syncs"]
            s.emit(Mark(MARK, self.name, "enter"))
            s.tee, s.tee_puts = tee, puts = [], []
        try:
            with as_traced(opts), wrapped(opts, ledger):
                result = self.owner.fn(*args, **kwargs)
        finally:
            with LOCK:
                s.emit(Mark(MARK, self.name, "exit"))  # the frees of the call's locals come first
                s.tee, s.tee_puts = None, None
                s.flush()
        rec = Recording(leaves, roots, before, tensor_slots(roots), result, tee[:-1], puts)
        rec.syncs = s.counters["syncs"] - syncs
        rec.sync_at = s.matcher.lines.last.get("syncs") if rec.syncs else None
        rec.settings, rec.knob_floats = settings, attribute(rec.instrs, ledger)
        self.recorded = [*self.recorded[-1:], rec]
        self.calls += 1
        if self.calls >= RECORD_LIMIT and self.recipe is None and self.refused is None:
            self._refuse(
                f"{self.calls} calls recorded without a block the worker saw twice alike: the "
                "step records different work each call"
            )
        return result

    def _prepare(self) -> None:
        """Turn the last two recorded calls into a recipe, once the worker sent the plan."""
        a, b = self.recorded[-2], self.recorded[-1]
        ops = {idx: op_name(op) for op, idx in self.session.op_index.items()}
        why = b.unreplayable() or differ(a, b, ops) or b.written_constant(self.session.op_index)
        if why is not None:
            self._refuse(why)
            return
        if a.shape() != b.shape():
            return  # other work each call so far: recording goes on
        got = self.session.request(JitPlan(self.name))  # once per key
        if got is None:
            return  # the worker saw two blocks (other input metadata): recording goes on
        sig, plan = got
        self.sig = sig
        self.facts = None
        try:
            self.recipe = Recipe(plan, b)
        except Refused as exc:
            self._refuse(str(exc), sig)
            return
        self.session.log.emit(
            ev.JIT,
            function=self.owner.name,
            name=self.name,
            state="replaying",
            signature=sig,
            frozen=b.frozen(ops),
            constants=b.constants(),
            flowing=sorted(key for _, key in self.recipe.flowing),  # settings sent each call
            inputs=len(self.recipe.inputs),
            outputs=len(self.recipe.outputs),
        )

    def _refuse(self, reason: str, sig: str | None = None) -> None:
        self.refused = reason
        self.recipe = None
        self.session.log.emit(
            ev.JIT,
            function=self.owner.name,
            name=self.name,
            state="refused",
            signature=sig or self.sig,
            reason=reason,
        )

    # -- replaying -----------------------------------------------------------------------
    def _replay(self, leaves):
        s, r = self.session, self.recipe
        with LOCK:
            s.check()
            ids = self._inputs_fast(leaves)
            if ids is None:
                ids = self._inputs(leaves)
                if ids is None:
                    return _UNFIT
            produced = s.new_ids(r.n_produced)  # (a range: consecutive ids)
            if s.matcher.kept:
                s.matcher.release()
            out, freed = s.out, s.freed  # (out: a jit call being recorded sees them too)
            while freed:  # straight out: the RUN after them ends any occurrence they start
                out(Free(FREE, freed.popleft()))
            scalars = [evaluate(e, groups(r.optimizers)) for e in r.scalars] if r.scalars else ()
            out(Run(RUN, r.sig, ids, produced, scalars))
            s.send_now()
            self.replayed += 1
            outs = [Proxy(s, produced[k], meta) for k, meta in r.outputs]
            for place in r.cleared:
                place.write(None)
            for place, j in r.placed:
                place.write(outs[j])
        if r.single is not None:
            return outs[r.single]
        res_leaves = [outs[x[1]] if type(x) is tuple and x and x[0] is OUT else x for x in r.result]
        return tree_unflatten(res_leaves, r.result_spec)

    def _inputs_fast(self, leaves) -> list | None:
        """The inputs' ids when every root and input is as the last calls found them (the
        steady state), read in flat passes; None sends the call to ``_inputs``."""
        r, s = self.recipe, self.session
        try:
            roots = [g(o, k) for g, o, k in r.root_readers]
            got = [leaves[k] if g is None else g(o, k) for g, o, k in r.readers]
            facts = list(map(_FACTS, got))  # (AttributeError: not a proxy)
        except Exception:
            return None
        if facts != self.facts or not all(map(operator.is_, roots, r.root_objs)):
            if self.facts is None:  # (first replay: what the steady state looks like)
                self.facts = [(s, k, None) for k in r.keys]
            return None
        return list(map(_ID, got))

    def _inputs(self, leaves) -> list | None:
        """The inputs' ids, each checked (None: one no longer fits; the function runs)."""
        s, r = self.session, self.recipe
        for place, obj in r.roots:
            if place.read() is not obj:  # a global or closure name bound to another object
                self._unfit(place, obj, None)
                return None
        ids = []
        for src, k in r.inputs:
            p = leaves[src] if type(src) is int else src.read()
            if type(p) is not Proxy or p._gt_s is not s or p._gt_k != k:
                self._unfit(src, p, k)
                return None
            if p._gt_v is not None:
                p._gt_v = None  # its shadow would not follow the replayed block
            ids.append(p._gt_id)
        return ids

    def _bound(self) -> None:
        """Bound the replayed calls in flight: the worker reads every message at once, so a
        client far ahead would make its memory grow; past IN_FLIGHT calls, wait for it."""
        if self.replayed % _MARK_EVERY:
            return
        t = self.session.transport
        window = IN_FLIGHT // _MARK_EVERY
        self.marks.append(t.post_mark(self.marks[0] if len(self.marks) >= window else None))
        while len(self.marks) > window:
            t.wait_mark(self.marks.popleft())

    def _retune(self) -> None:
        """An optimizer's settings (a scheduler's new lr) changed since the recipe was made:
        its numbers are frozen in the block, so recording starts over (never a stale replay)."""
        now = knobs(self.recipe.optimizers, self.recipe.flowing)
        changed = next(
            (f"{k}: {a!r} -> {b!r}" for x, y in zip(self.recipe.knobs, now, strict=True)
             for (k, a), (_, b) in zip(x, y, strict=True) if a != b),
            "its param groups",
        )  # fmt: skip
        self._ran(f"an optimizer setting the step reads changed ({changed}): recorded again")

    def _ran(self, reason: str) -> None:
        """Replay stops: the function ran (``reason`` said), and recording starts over."""
        self.session.log.emit(
            ev.JIT,
            function=self.owner.name,
            name=self.name,
            state="ran",
            signature=self.recipe.sig,
            reason=reason,
        )
        self.recipe, self.facts = None, None
        # The last recorded call stays: the next one is compared with it, so a setting that
        # changed between them (a scheduler's step) flows into the block as an input.
        self.recorded, self.calls = self.recorded[-1:], 0  # (its record limit starts over)

    def _unfit(self, src, p, k) -> None:
        where = f"argument {src}" if type(src) is int else src.describe()
        if k is None:
            got = "it now holds another object"
        else:
            got = "not a worker tensor" if type(p) is not Proxy else f"metadata {p._gt_m}"
        self._ran(f"{where} no longer fits the block ({got}): the function ran instead")

    def stats(self) -> dict:
        return {
            "function": self.owner.name,
            "name": self.name,
            "signature": self.sig,
            "replayed": self.replayed,
            "client_ms": statistics.median(self.client_ms) if self.client_ms else None,
        }


_UNFIT = object()
_FACTS = operator.attrgetter("_gt_s", "_gt_k", "_gt_v")  # a fitting input: (session, key, None)
_ID = operator.attrgetter("_gt_id")
