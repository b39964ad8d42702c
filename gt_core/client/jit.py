"""``gt_core.jit``: once a step is known, a call sends one message instead of running its Python.

Inside ``capture()`` (or a ``%%gt`` cell), a call of a jitted function is first recorded as
any code is, with marks around it, so the worker sees exactly the call as one block. Once two
recorded calls with the same key (its tensor arguments' metadata, its other arguments'
values) made the same block, and the worker has sent that block's plan, a call no longer
runs the function: it reads the block's inputs where the recorded call found them (its
arguments, parameters, their ``.grad``, optimizer state), sends one RUN, and puts proxies for
the block's outputs where the recorded call left them (its result, ``.grad``, optimizer
state). The worker runs the block compiled (eagerly until its compile is done).

Contract (what a replayed call does not repeat)
  * Only tensors flow. Python values the step reads (a float learning rate, Adam's bias
    corrections) are frozen as the recorded calls had them; where they differ between
    recorded calls, replay is refused with the op and the values, and the function keeps
    running (compiled as any hot path). Use tensors for values that change (``lr`` as a
    tensor that a scheduler updates outside the step; ``capturable=True`` optimizers).
  * Python side effects are not repeated: prints, appends to lists, attributes other than
    the tensor state above, Python's own random numbers.
  * A sync inside the step (``.item()``, printing a tensor, data-dependent shapes) refuses
    replay: the step needs its Python.
  * Tensors the step reads must be reachable from its arguments, closure or globals through
    tensors, modules, optimizers, LR schedulers, dicts, lists and tuples; outputs the same.
  * Outputs of a replayed call are detached (no autograd graph leads to them).
Never a wrong replay: an input that no longer fits (a parameter replaced, its metadata
changed) runs the function instead, with the reason as an event; the worker checks each
RUN's inputs against the block as well.
"""

from __future__ import annotations

import collections
import functools
import statistics
import time
import types

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from gt_core.client.proxy import Proxy, upload
from gt_core.client.replay import Occurrence
from gt_core.client.session import LOCK
from gt_core.observe import events as ev
from gt_core.stream.instructions import FREE, JIT_SIGNAL, MARK, OP, RUN, Ref, op_name

__all__ = ["jit", "Jit"]

RECORD_LIMIT = 6  # recorded calls of one key without a repeatable block: replay refused
IN_FLIGHT = 32  # replayed calls the worker may be behind by before a call waits for it
_MARK_EVERY = 8  # a progress mark is posted every this many replayed calls
_CLIENT_MS = 256  # the client's ms of the newest replayed calls kept (for the median)


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
        from gt_core.client import capture as _capture

        s = _capture._here.session
        if s is None:  # outside a capture: an ordinary call
            return self.fn(*args, **kwargs)
        if not kwargs and all(type(a) is Proxy for a in args):
            leaves, spec = list(args), len(args)  # the common case, without pytree
        else:
            leaves, spec = tree_flatten((args, kwargs))
            with LOCK:
                leaves = [upload(s, x) if _plain_tensor(x) else x for x in leaves]
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
        self.recorded: list[_Recording] = []
        self.recipe: _Recipe | None = None
        self.refused: str | None = None
        self.replayed = 0
        self.client_ms: collections.deque = collections.deque(maxlen=_CLIENT_MS)
        self.marks: collections.deque = collections.deque()
        self.calls = 0  # recorded calls
        session.jits.append(self)
        self.sig: str | None = None  # the block's signature, once the worker has it

    def call(self, leaves, spec):
        if self.refused is None and self.recipe is None and len(self.recorded) >= 2:
            self._prepare()
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
        roots = _roots(self.owner.fn, leaves)
        with LOCK:
            s.flush()
            before = _scan(roots)
            syncs = s.counters["syncs"]
            s.emit((MARK, self.name, "enter"))
            s.tee = tee = []
        try:
            result = self.owner.fn(*args, **kwargs)
        finally:
            with LOCK:
                s.emit((MARK, self.name, "exit"))  # the frees of the call's locals come first
                s.tee = None
                s.flush()
        rec = _Recording(leaves, roots, before, _scan(roots), result, tee[:-1])
        rec.syncs = s.counters["syncs"] - syncs
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
        why = b.unreplayable() or _differ(a, b, ops)
        if why is not None:
            self._refuse(why)
            return
        if a.shape() != b.shape():
            return  # other work each call so far: recording goes on
        got = self.session.request("engine", ("jit", self.name))  # once per key
        if got is None:
            return  # the worker saw two blocks (other input metadata): recording goes on
        sig, plan = got
        self.sig = sig
        try:
            self.recipe = _Recipe(plan, b)
        except _Refused as exc:
            self._refuse(str(exc), sig)
            return
        self.session.log.emit(
            ev.JIT,
            function=self.owner.name,
            name=self.name,
            state="replaying",
            signature=sig,
            frozen=b.frozen(ops),
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
            for place, obj in r.roots:
                if _read(place) is not obj:  # a global or closure name bound to another object
                    self._unfit(place, obj, None)
                    return _UNFIT
            ids = []
            for src, k in r.inputs:
                p = leaves[src] if type(src) is int else _read(src)
                if type(p) is not Proxy or p._gt_s is not s or p._gt_k != k:
                    self._unfit(src, p, k)
                    return _UNFIT
                if p._gt_v is not None:
                    p._gt_v = None  # its shadow would not follow the replayed block
                ids.append(p._gt_id)
            produced = s.new_ids(r.n_produced)
            if s.freed:
                s._frees()  # before the RUN, in one message with it
            if s.replay.kept:
                s.replay.release()
            s._out((RUN, r.sig, ids, produced, ()))
            s._send()
            self.replayed += 1
            outs = [Proxy(s, produced[k], meta) for k, meta in r.outputs]
            for place in r.cleared:
                _write(place, None)
            for place, j in r.placed:
                _write(place, outs[j])
        if r.single is not None:
            return outs[r.single]
        res_leaves = [
            outs[x[1]] if type(x) is tuple and x and x[0] is _OUT else x for x in r.result
        ]
        return tree_unflatten(res_leaves, r.result_spec)

    def _bound(self) -> None:
        """Bound the replayed calls in flight: the worker reads every message at once, so a
        client far ahead would make its memory grow; past IN_FLIGHT calls, wait for it."""
        if self.replayed % _MARK_EVERY:
            return
        t = self.session.transport
        self.marks.append(t.post_mark())
        while len(self.marks) > IN_FLIGHT // _MARK_EVERY:
            t.wait_mark(self.marks.popleft())

    def _unfit(self, src, p, k) -> None:
        where = f"argument {src}" if type(src) is int else _words(src)
        if k is None:
            got = "it now holds another object"
        else:
            got = "not a worker tensor" if type(p) is not Proxy else f"metadata {p._gt_m}"
        self.session.log.emit(
            ev.JIT,
            function=self.owner.name,
            name=self.name,
            state="ran",
            signature=self.recipe.sig,
            reason=f"{where} no longer fits the block ({got}): the function ran instead",
        )
        self.recipe = None
        self.recorded = []

    def stats(self) -> dict:
        return {
            "function": self.owner.name,
            "name": self.name,
            "signature": self.sig,
            "replayed": self.replayed,
            "client_ms": statistics.median(self.client_ms) if self.client_ms else None,
        }


_UNFIT = object()
_OUT = "gt-jit-output"


class _Refused(Exception):
    pass


class _Recording:
    """One recorded call: what it read where, what it left where, its instructions."""

    def __init__(self, leaves, roots, before, after, result, instrs):
        self.arg_ids = {x._gt_id: i for i, x in enumerate(leaves) if type(x) is Proxy}
        self.arg_keys = {i: x._gt_k for i, x in enumerate(leaves) if type(x) is Proxy}
        self.roots = [(place, obj) for place, obj in roots if place is not None]
        self.before, self.after = before, after
        self.result_leaves, self.result_spec = tree_flatten(result)
        self.instrs = instrs
        self.syncs = 0

    def unreplayable(self) -> str | None:
        if self.syncs:
            return (
                f"a sync inside the step ({self.syncs} per call: .item(), printing a tensor, "
                "a data-dependent shape): replay cannot answer it, the function keeps running"
            )
        other = [ins for ins in self.instrs if ins[0] not in (OP, FREE)]
        if other:
            return (
                "the step uploads data or seeds the generator each call (a plain tensor or "
                "torch.manual_seed inside it): move that out of the jitted function"
            )
        return None

    def shape(self) -> list:
        """The instructions without their ids (what two calls must share)."""
        return [_shape(ins) for ins in self.instrs]

    def floats(self) -> list:
        """(op, argument, value) of every Python float the call passed to an op."""
        out = []
        for ins in self.instrs:
            if ins[0] == OP:
                for where, v in _float_args(ins):
                    out.append((ins[1], where, v))
        return out

    def frozen(self, ops: dict) -> list[dict]:
        """The Python numbers a replay keeps as recorded: {op, arg, value, count} each."""
        counts = collections.Counter((ops.get(i, str(i)), w, v) for i, w, v in self.floats())
        return [{"op": o, "arg": w, "value": v, "count": n} for (o, w, v), n in counts.items()]


def _differ(a: _Recording, b: _Recording, ops: dict) -> str | None:
    """Why two recorded calls cannot share one replay (None: they can)."""
    if len(a.instrs) != len(b.instrs) or a.shape() != b.shape():
        return None  # other work: the worker sees another block; recording goes on
    for (i, where, x), (_, _, y) in zip(a.floats(), b.floats(), strict=True):
        if x != y:
            return (
                f"a Python number the step passes to {ops.get(i, i)} ({where}) changed between "
                f"calls ({x!r} -> {y!r}): replay would freeze it. Make it a tensor (e.g. "
                "lr=torch.tensor(...), capturable=True), or keep calling without jit"
            )
    for x, y in zip(a.result_leaves, b.result_leaves, strict=True):
        if type(x) is not Proxy and x != y:
            return f"the step returns a Python value that changes ({x!r} -> {y!r})"
    return None


def _shape(ins) -> tuple:
    if ins[0] == FREE:
        return (FREE,)
    return (
        OP,
        ins[1],
        _strip(ins[2]),
        tuple(sorted((k, _strip(v)) for k, v in ins[3].items())),
        tuple(o is None for o in ins[4]),
    )


def _strip(a):
    t = type(a)
    if t is float:
        return float
    if t is list or t is tuple:
        return tuple(_strip(x) for x in a)
    if t is Ref:
        return Ref
    return a


def _float_args(ins):
    for i, a in enumerate(ins[2]):
        yield from _floats(a, f"argument {i}")
    for k, v in ins[3].items():
        yield from _floats(v, k)


def _floats(a, where):
    if type(a) is float:
        yield where, a
    elif type(a) in (list, tuple):
        for j, x in enumerate(a):
            yield from _floats(x, f"{where}[{j}]")


class _Recipe:
    """What a replayed call does: where each input is read, where each output goes."""

    def __init__(self, plan, rec: _Recording):
        occ = Occurrence(plan)
        for ins in rec.instrs:
            if not occ.match(ins):
                raise _Refused("the worker's block does not match the recorded call")
        if occ.pos != occ.n:
            raise _Refused("the worker's block is shorter than the recorded call")
        self.sig = plan.sig
        self.roots = rec.roots
        self.n_produced = len(occ.produced)
        before = {}
        for place, p in rec.before:
            if p is not None:
                before.setdefault(p._gt_id, (place, p))
        self.inputs = []
        for vid in occ.inputs:
            if vid in rec.arg_ids:
                i = rec.arg_ids[vid]
                self.inputs.append((i, rec.arg_keys[i]))
            elif vid in before:
                place, p = before[vid]
                self.inputs.append((place, p._gt_k))
            else:
                raise _Refused(
                    "the step reads a worker tensor jit cannot find again: not an argument, nor "
                    "reachable from its closure or globals (through modules, optimizers, dicts, "
                    "lists)"
                )
        freed = {ins[1] for ins in rec.instrs if ins[0] == FREE}
        alive = [k for k, vid in enumerate(occ.produced) if vid not in freed]
        index = {occ.produced[k]: j for j, k in enumerate(alive)}
        metas: dict[int, tuple] = {}
        self.placed = []
        self.cleared = []
        places_after = {_pid(place): (place, p) for place, p in rec.after}
        for key, (place, p) in places_after.items():
            was = _before_id(rec.before, key)
            now = p._gt_id if p is not None else None
            if was == now:
                continue
            if now is None:
                self.cleared.append(place)
            elif now in index:
                self.placed.append((place, index[now]))
                metas[now] = p._gt_m
            else:
                raise _Refused(f"the step moves a tensor into {_words(place)}: replay cannot")
        self.result_spec = rec.result_spec
        self.result = []
        for x in rec.result_leaves:
            if type(x) is Proxy:
                if x._gt_id not in index:
                    raise _Refused("the step returns a tensor it did not make (an input)")
                self.result.append((_OUT, index[x._gt_id]))
                metas[x._gt_id] = x._gt_m
            else:
                self.result.append(x)
        one = (
            len(self.result) == 1
            and type(self.result[0]) is tuple
            and rec.result_spec.num_nodes == 1
        )
        self.single = self.result[0][1] if one else None  # one tensor: returned without pytree
        missing = [occ.produced[k] for k in alive if occ.produced[k] not in metas]
        if missing:
            raise _Refused(
                f"{len(missing)} tensor(s) the step makes stay alive where jit cannot put them "
                "again (e.g. appended to a list, or kept by an autograd graph): return them"
            )
        self.outputs = [(k, metas[occ.produced[k]]) for k in alive]


# -- where tensors are: places in the step's reachable state ---------------------------------
def _roots(fn, leaves) -> list:
    """[(place or None, object)] the step can reach: its arguments (no place: they come with
    each call), its bound self, its closure's cells and the globals it names."""
    roots = [(None, x) for x in leaves if not isinstance(x, (int, float, str, bool, type(None)))]
    f = getattr(fn, "__func__", fn)
    if getattr(fn, "__self__", None) is not None:
        roots.append((None, fn.__self__))
    code = getattr(f, "__code__", None)
    if code is not None:
        for cell in f.__closure__ or ():
            try:
                roots.append((("attr", cell, "cell_contents"), cell.cell_contents))
            except ValueError:  # a cell not yet bound
                pass
        g = f.__globals__
        roots += [(("item", g, n), g[n]) for n in sorted(_names(code)) if n in g]
    return [(place, obj) for place, obj in roots if not isinstance(obj, types.ModuleType)]


def _names(code) -> set:
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _scan(roots) -> list:
    """[(place, proxy or None)] for every tensor slot reachable from ``roots``."""
    out: list = []
    seen: set[int] = set()
    for place, obj in roots:
        if isinstance(obj, Proxy):
            if place is not None:
                _slot(place, obj, out)
            _slot(("attr", obj, "grad"), obj.grad, out)
        else:
            _visit(obj, out, seen, 0)
    return out


def _visit(obj, out, seen, depth) -> None:
    if id(obj) in seen or depth > 3:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        for m in obj.modules():
            for d in (m._parameters, m._buffers):
                for name, t in d.items():
                    _slot(("item", d, name), t, out)
                    if t is not None and isinstance(t, Proxy):
                        _slot(("attr", t, "grad"), t.grad, out)
    elif isinstance(obj, torch.optim.Optimizer):
        for group in obj.param_groups:
            _visit(group, out, seen, depth + 1)
            for p in group["params"]:
                if isinstance(p, Proxy):
                    _slot(("attr", p, "grad"), p.grad, out)
        for st in obj.state.values():
            _visit(st, out, seen, depth + 1)
    elif isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        _visit(obj.optimizer, out, seen, depth + 1)
    elif isinstance(obj, dict):
        for k, v in list(obj.items()):
            if isinstance(v, torch.Tensor):
                _slot(("item", obj, k), v, out)
            elif isinstance(v, (dict, list, tuple, torch.nn.Module, torch.optim.Optimizer)):
                _visit(v, out, seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            if isinstance(v, torch.Tensor):
                if type(obj) is list:  # (a tuple's tensors cannot be put back: no place)
                    _slot(("item", obj, i), v, out)
            elif isinstance(v, (dict, list, tuple, torch.nn.Module, torch.optim.Optimizer)):
                _visit(v, out, seen, depth + 1)


def _slot(place, t, out) -> None:
    if t is None or isinstance(t, Proxy):
        out.append((place, t))


def _pid(place) -> tuple:
    return (place[0], id(place[1]), place[2] if len(place) > 2 else None)


def _before_id(before, key):
    for place, p in before:
        if _pid(place) == key:
            return p._gt_id if p is not None else None
    return None


def _read(place):
    try:
        if place[0] == "item":
            return place[1][place[2]]
        return getattr(place[1], place[2])
    except (KeyError, IndexError, AttributeError, ValueError):
        return None


def _write(place, value) -> None:
    if place[0] == "item":
        place[1][place[2]] = value
    else:
        setattr(place[1], place[2], value)


def _words(place) -> str:
    if place[0] == "attr":
        if isinstance(place[1], torch.Tensor):
            return f"the .{place[2]} of a tensor {list(place[1].shape)}"
        return f"the closure variable ({place[2]})"
    return f"entry {place[2]!r} of a {type(place[1]).__name__}"
