"""Each call of a user's compiled function: did it run compiled, compile, or run eagerly, how
long did it take, and how does the compiled function compare with eager on the same inputs.

Three sources, all per call on the calling thread:

- the stance hook (:mod:`.stance`) sees a call begin and hands us Dynamo's wrapper frame; a
  callable appended to that frame's ``cleanups`` sees it end (its wall time on the host);
- Dynamo's guard-complete hook says, for each frame of the call that has cache entries,
  whether one fitted (its compiled code ran) or none did (the frame compiles; past the
  recompile limit it runs eagerly);
- a compile record made while the call is open (:meth:`Calls.compiled_now`) marks it as a
  call that compiled.

So a call is ``compiled`` (every frame checked fitted an entry), ``compiling`` (a compile ran
in it: a first call, a recompile, a resume function's first compile), ``eager`` (no entry
fitted and nothing compiled: past the limit, or a frame Dynamo skips), ``partly_eager`` (some
frames fitted, others ran eagerly), ``eager_sample``, or ``raised`` (an exception left the
call: a compile that failed, ``error_on_recompile``, the user's own error; it ran neither way
to its end, and is not timed).

Eager samples: one call in ``every`` runs eagerly on purpose (its stance callback None, as
``torch.compiler.set_stance("force_eager")`` would), so the compiled calls are timed against
eager ones on the same inputs in the same loop. Only a call whose inputs (shapes, strides,
dtypes, devices, Python numbers, grad mode, a module's train/eval) equal those of the last
call, which ran compiled, is taken: it would have fitted a cached entry, so no recompile is
moved to a later call. At most ``SAMPLES`` per function; ``every=0`` takes none (and the
report says the comparison is off). Eager is the reference a compiled result is checked
against, so a sampled call changes no result beyond the compiler's rounding.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.diagnostics.names import in_gt
from gt_core.observe import events as ev

__all__ = ["Calls", "COMPARED_AT_LEAST", "OUTCOMES", "SAMPLES", "inputs_key"]

OUTCOMES = ("compiled", "compiling", "eager", "partly_eager", "eager_sample", "raised")
SAMPLES = 5  # eager samples per function at most (each costs what compiling saves)
# Samples compared before a speedup is said: the median of three outlasts one sample that
# paid a one-time cost (a first eager run of new shapes took 7x the later ones, measured)
COMPARED_AT_LEAST = 3
_KEPT = 256  # call times kept per function and inputs (medians over the latest)
_KEYS = 16  # distinct inputs whose times are kept per function (the first ones seen)


def inputs_key(fn, args: tuple, kwargs: dict):
    """What a call's cache lookup depends on, as far as its arguments show it: each tensor's
    shape, strides, dtype, device and requires_grad, each Python number's value, a module's
    identity and train/eval mode, and grad mode. Equal keys: the same cache entry fits
    (unless a global the function reads changed)."""
    import torch

    owner = getattr(fn, "__self__", None)
    mode = owner.training if isinstance(owner, torch.nn.Module) else None
    parts = [torch.is_grad_enabled(), mode, *map(_part, args)]
    parts += [(k, _part(v)) for k, v in sorted(kwargs.items())]
    return tuple(parts)


def _part(v, depth: int = 0):
    import torch

    if isinstance(v, torch.Tensor):
        return (tuple(v.shape), v.stride(), v.dtype, v.device, v.requires_grad)
    if v is None or type(v) in (int, float, bool, str):
        return v
    if isinstance(v, (list, tuple)) and depth < 2 and len(v) <= 16:
        return (type(v), tuple(_part(x, depth + 1) for x in v))
    if isinstance(v, dict) and depth < 2 and len(v) <= 16:
        return (dict, tuple((k, _part(x, depth + 1)) for k, x in v.items()))
    if isinstance(v, torch.nn.Module):
        return (type(v), id(v), v.training)
    return (type(v), id(v))


@dataclass
class _Call:
    name: str
    key: object
    t0: float
    sample: bool
    hits: int = 0
    misses: int = 0
    compiled: bool = False  # a compile ran while the call was open
    mark: float = 0.0  # when the last graph began or ended, or the last frame was checked
    graph_ms: float = 0.0  # in its graphs
    sites: dict = field(default_factory=dict)  # break site "file:line" -> ms outside the graphs
    # the exception being handled where the call began (a call made in an ``except`` block):
    # one seen at its end that is not this one left the call
    handling: BaseException | None = None
    raised: bool = False

    def __post_init__(self):
        self.mark = self.t0

    def checked(self, now: float, site: str | None) -> None:
        """A frame was checked; ``site``: the graph break whose resume function it is. The
        time since the last graph ended ran outside the graphs: at that break (its Python
        ran eagerly, then called the resume function), or in Dynamo's own work."""
        if site is not None:
            self.sites[site] = self.sites.get(site, 0.0) + (now - self.mark) * 1e3
        self.mark = now

    def graph(self, began: float, ended: float) -> None:
        self.graph_ms += (ended - began) * 1e3
        self.mark = ended

    def outcome(self) -> str:
        if self.raised:
            return "raised"
        if self.sample:
            return "eager_sample"
        if self.compiled:
            return "compiling"
        if self.misses and self.hits:
            return "partly_eager"
        if self.hits:
            return "compiled"
        return "eager"  # (no entry fitted, or no frame had one: Dynamo skipped it)


@dataclass
class _Tally:
    """One function's calls so far."""

    outcomes: Counter = field(default_factory=Counter)
    ms: dict = field(default_factory=dict)  # (outcome, inputs key) -> [ms, ...]
    last: tuple | None = None  # (inputs key, outcome) of the last call ended
    since_sample: int = 0  # compiled calls since the last eager sample
    samples: int = 0
    ratios: list = field(default_factory=list)  # each sample: eager ms / compiled median ms
    graph_ms: list = field(default_factory=list)  # each compiled call's ms in its graphs
    sites: dict = field(default_factory=dict)  # break site -> [calls, total ms outside graphs]

    def times(self, outcome: str, key) -> list:
        kept = self.ms.get((outcome, key))
        if kept is None:
            if sum(k[0] == outcome for k in self.ms) >= _KEYS:
                return []  # (a throwaway list: times of too many distinct inputs go unkept)
            kept = self.ms[(outcome, key)] = []
        return kept

    def median(self, outcome: str) -> float | None:
        ms = [m for (o, _), kept in self.ms.items() if o == outcome for m in kept]
        return statistics.median(ms) if ms else None


class Calls:
    """The calls of every compiled function while one diagnostics block is open.

    ``emit(type, **fields)`` publishes a ``user.calls`` snapshot per function at most every
    ``emit_every_s`` (a live dashboard) and at :meth:`flush`; ``clock`` is injectable, so
    tests do not depend on the machine's speed.
    """

    def __init__(
        self,
        emit: Callable,
        every: int,
        clock: Callable[[], float] = time.perf_counter,
        emit_every_s: float = 1.0,
    ):
        self.emit, self.every, self.clock, self.emit_every_s = emit, every, clock, emit_every_s
        self.lock = threading.Lock()
        self.local = threading.local()  # .open: this thread's calls under way, innermost last
        self.tallies: dict[str, _Tally] = {}
        self.emitted_at: float | None = None
        self.changed: set[str] = set()  # functions whose snapshot is not yet published

    def _open(self) -> list:
        stack = getattr(self.local, "open", None)
        if stack is None:
            stack = self.local.open = []
        return stack

    # -- the hooks ------------------------------------------------------------------------
    def begin(self, name: str, fn, frame) -> bool:
        """A call of compiled ``fn`` begins (Dynamo's wrapper ``frame``): True runs it
        eagerly, an eager sample."""
        if in_gt():
            return False
        cleanups, args, kwargs = hooks.call_parts(frame)
        if cleanups is None:
            return False  # (its end cannot be seen: not counted)
        # (the inputs matter to samples alone: with none taken, they are not read)
        key = inputs_key(fn, args, kwargs) if self.every > 0 else None
        with self.lock:
            tally = self.tallies.setdefault(name, _Tally())
            sample = (
                self.every > 0
                and tally.samples < SAMPLES
                and tally.since_sample >= self.every - 1
                and tally.last == (key, "compiled")
            )
        call = _Call(name, key, self.clock(), sample, handling=sys.exc_info()[1])
        stack = self._open()
        stack.append(call)
        cleanups.append(lambda: self._end(call, stack))
        return sample

    def guard(self, hit: bool, caller) -> None:
        """A frame's guards were checked (Dynamo's guard-complete hook); ``caller``: the
        frame that called it (at a graph break's line, for a resume function)."""
        stack = getattr(self.local, "open", None)
        if not stack:
            return
        call = stack[-1]
        if hit:
            call.hits += 1
        else:
            call.misses += 1
        site = None
        if caller is not None and not hooks.is_call_wrapper(caller):
            site = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        call.checked(self.clock(), site)

    def wrap_graph(self, fn):
        """``fn``, a graph Dynamo compiled, timed into the call that runs it (the time
        between graphs is then outside them: see _Call.checked). Outside a call it runs as
        it is."""
        if in_gt():
            return fn
        local, clock = self.local, self.clock

        def graph(*args, **kwargs):
            stack = getattr(local, "open", None)
            if not stack:
                return fn(*args, **kwargs)
            call, began = stack[-1], clock()
            try:
                return fn(*args, **kwargs)
            finally:
                call.graph(began, clock())

        return graph

    def compiled_now(self) -> None:
        """A compile record was made on this thread: every call open here compiled."""
        for call in getattr(self.local, "open", None) or ():
            call.compiled = True

    def _end(self, call: _Call, stack: list) -> None:
        ms = (self.clock() - call.t0) * 1e3
        if call in stack:
            stack.remove(call)
        # (Dynamo's wrapper runs its cleanups in a ``finally``: an exception leaving the call
        # is the one being handled there)
        leaving = sys.exc_info()[1]
        call.raised = leaving is not None and leaving is not call.handling
        outcome = call.outcome()
        with self.lock:
            tally = self.tallies[call.name]
            tally.outcomes[outcome] += 1
            if outcome == "eager_sample":
                compiled = tally.times("compiled", call.key)
                if compiled:
                    tally.ratios.append(ms / statistics.median(compiled))
                tally.samples += 1
                tally.since_sample = 0
            elif outcome == "compiled":
                tally.since_sample += 1
                tally.graph_ms.append(call.graph_ms)
                del tally.graph_ms[:-_KEPT]
                for site, site_ms in call.sites.items():
                    seen = tally.sites.setdefault(site, [0, 0.0])
                    seen[0] += 1
                    seen[1] += site_ms
            if outcome != "raised":  # (not timed: it ran neither way to its end)
                kept = tally.times(outcome, call.key)
                kept.append(ms)
                del kept[:-_KEPT]
            tally.last = (call.key, outcome)
            self.changed.add(call.name)
            now = self.clock()
            due = self.emitted_at is None or now - self.emitted_at >= self.emit_every_s
        if due:
            self.flush(now)

    # -- what is published ----------------------------------------------------------------
    def flush(self, now: float | None = None) -> None:
        """Publish a ``user.calls`` snapshot of each function whose calls changed."""
        with self.lock:
            self.emitted_at = self.clock() if now is None else now
            names, self.changed = sorted(self.changed), set()
            snapshots = [(n, self.snapshot(n)) for n in names]
        for name, snap in snapshots:
            self.emit(ev.USER_CALLS, function=name, **snap)

    def snapshot(self, name: str) -> dict:
        """One function's calls: how many of each outcome, median ms of each, and the eager
        samples' ratio to the compiled calls on the same inputs."""
        t = self.tallies[name]
        ms = {o: t.median(o) for o in OUTCOMES if t.outcomes[o]}
        return {
            "calls": sum(t.outcomes.values()),
            "outcomes": {o: t.outcomes[o] for o in OUTCOMES if t.outcomes[o]},
            "median_ms": {o: round(m, 4) for o, m in ms.items() if m is not None},
            "samples": t.samples,
            "speedup": (
                round(statistics.median(t.ratios), 3)
                if len(t.ratios) >= COMPARED_AT_LEAST
                else None
            ),
            "compared": len(t.ratios),
            "compared_needed": COMPARED_AT_LEAST,
            "eager_every": self.every,
            # (of the compiled calls: ms in graphs, and outside them at each graph break)
            "graph_ms": round(statistics.median(t.graph_ms), 4) if t.graph_ms else None,
            "breaks": [
                {"where": site, "calls": n, "ms": round(ms, 4)}
                for site, (n, ms) in sorted(t.sites.items(), key=lambda kv: -kv[1][1])
            ],
        }
