"""Hot paths: find the block that repeats in the instruction stream and run it compiled.

The engine sits between the worker's transport and its executor. Each instruction either
runs eagerly (and joins the history the detector searches), or, when a hot block is
expected, is matched against the block's canonical form and buffered; a complete
occurrence then runs as one call of the compiled function. A mismatch mid-block runs the
buffered instructions eagerly: correct, just not faster.

Each hot block's plan goes to the client (``gt_core.stream.plan``), which from then on sends a
whole occurrence as one RUN instruction: the engine checks its inputs against the block's
and runs it like an occurrence it matched itself, with no per-instruction work.

States of a block (named as in the report): hot → compiling → compiled, or failed /
reverted; blocks marked by a signal start as recording.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import traceback
from collections import deque

import torch

from gt_core.compile.lower import (
    build_graph,
    compile_block,
    cudagraph_skips,
    replay_here,
    uses_cudagraphs,
)
from gt_core.compile.process import CompileProcess
from gt_core.config import Options
from gt_core.errors import CompiledRunFailed
from gt_core.observe import events as ev
from gt_core.observe.report import Status
from gt_core.stream.canonical import Canonical, Mismatch, Namer, _finish, _name, canonicalize
from gt_core.stream.instructions import (
    BARRIERS,
    DEFOP,
    FREE,
    JIT_SIGNAL,
    MARK,
    OP,
    RUN,
    SYNC,
    Ref,
    op_name,
)
from gt_core.stream.lift import LiftNamer, lift_positions
from gt_core.stream.plan import expand, make_plan

__all__ = ["Engine"]


def timed(fn, *args):
    """(result, milliseconds) of fn(*args), synchronising CUDA so the time is real."""
    t0 = time.perf_counter()
    out = fn(*args)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3

# GT_DEBUG_COMPILE=1: one line per detection, compile, fallback, revert (2: every event
# but iterations: also compile starts, signals and mismatches).
_DEBUG_LINES = frozenset(
    (ev.DETECTED, ev.COMPILE_FINISHED, ev.COMPILE_FAILED, ev.RECOMPILE, ev.FALLBACK, ev.REVERT)
)
_BASELINE_RUNS = 2  # clean eager runs a regression check compares against
_MAX_PROBES = 4 * _BASELINE_RUNS  # eager runs timed for it at most, after the compile
# Iteration events wait up to this long to travel together (one message per step would cost
# the client a wake-up of its event thread per step); anything else and every sync send at once.
_EVENTS_EVERY_S = 0.05
_TIMED_RUNS = 1000  # timings a block keeps per series (its memory stays flat over long runs)


def _timed(kind: str, fn, *args):
    """(result, milliseconds) of a run of ``kind``, "eager" or "compiled": Engine.timer."""
    return timed(fn, *args)


def _out_paths(result) -> list[tuple]:
    """Where the tensors of an op's result are: [()] for a single tensor, else index paths."""
    if isinstance(result, torch.Tensor):
        return [()]
    out = []
    if isinstance(result, (list, tuple)):
        for i, r in enumerate(result):
            out.extend((i, *p) for p in _out_paths(r))
    return out


def _local_key(ins):
    """An instruction without its ids: equal for the same op at the same place in a period."""
    code = ins[0]
    if code == OP:
        return (OP, ins[1], _strip(ins[2]), len(ins[4]))
    if code == FREE:
        return (FREE,)
    return (code, ins[1] if code == MARK else None)


def _strip(a):
    t = type(a)
    if t is Ref:
        return Ref
    if t is list or t is tuple:
        return tuple(_strip(x) for x in a)
    if t is float:
        # Python floats that change every step (Adam's bias corrections, LR schedules) must
        # not hide the period; the canonical forms decide whether a segment really repeats.
        return float
    return a


def _exact(ins):
    return (ins[0], ins[1], repr(_strip_refs(ins[2])), repr(ins[3])) if ins[0] == OP else (ins[0],)


def _strip_refs(a):
    t = type(a)
    if t is Ref:
        return None
    if t is list or t is tuple:
        return tuple(_strip_refs(x) for x in a)
    return a


class Block:
    """A hot block: its canonical form, how to build its graph, its compiled function."""

    def __init__(
        self,
        canon: Canonical,
        out_paths: list,
        ops: dict,
        period: int,
        signal: str | None = None,
        lift: dict | None = None,
        scalar_dtypes: tuple = (),
        value_meta: dict | None = None,
    ):
        self.canon = canon
        self.lift = lift or {}  # entry position -> {argument path: dtype}: floats lifted to inputs
        self.scalar_dtypes = scalar_dtypes
        self.sig = canon.id
        self.out_paths = out_paths
        self.ops = ops  # op name -> OpOverload
        self.gap = period - len(canon.entries)  # instructions between occurrences (barriers)
        self.status = Status.HOT
        self.fn = None
        self.eager_fn = None  # the block's eager form as one generated function (see _run_eager)
        # Clean eager runs (the baseline of regression checks) and compiled ones: the latest
        # few, as a check reads only those and the client's report has every run's timing.
        self.eager_ms: deque[float] = deque(maxlen=_TIMED_RUNS)
        self.compiled_ms: deque[float] = deque(maxlen=_TIMED_RUNS)
        self.probe = 0  # eager runs still wanted as a baseline before judging the compiled one
        self.probed = 0  # eager runs timed as such a baseline
        # (kind, the worker's CPU condition) -> ms: what a regression check compares
        self.samples: dict[tuple, deque[float]] = {}
        self.judged = False  # regression check done
        # Any in-place op: a failure mid-run may have written some inputs already.
        self.mutates = any(ops[name]._schema.is_mutable for name in set(canon.ops))
        self.signal = signal
        self.thread: threading.Thread | None = None
        self.value_meta = value_meta or {}  # value name -> shape and dtype, for the graph
        self.plan = None  # set when registered: what the client matches and RUNs carry
        self.free_slots: list = []  # the plan's freed values, in order (what a RUN frees)
        self.withdrawn = False  # a RUN did not fit: the client no longer uses the plan
        self.n_produced = sum(1 for e in canon.entries if e[0] == "op" for o in e[4] if o is not None)

    @property
    def tracked(self) -> bool:
        # Failed and reverted blocks stay tracked (and run eagerly): that keeps the stream
        # aligned, so the same loop is not detected again at another rotation.
        return True


class Tracker:
    """One occurrence of a block in progress: the position reached and the names bound."""

    __slots__ = ("block", "namer", "pos")

    def __init__(self, block: Block, meta_of):
        self.block = block
        self.namer = LiftNamer(meta_of, block.lift) if block.lift else Namer(meta_of)
        self.pos = 0

    def match(self, ins, op_name_of) -> bool:
        entries = self.block.canon.entries
        try:
            got = self.namer.entry(ins, op_name_of)
        except (Mismatch, KeyError):
            return False
        if got != entries[self.pos]:
            return False
        k = len(self.namer.input_meta)
        if k and self.namer.input_meta[k - 1] != self.block.canon.input_meta[k - 1]:
            return False
        self.pos += 1
        return True

    @property
    def complete(self) -> bool:
        return self.pos == len(self.block.canon.entries)


class Occurrence:
    """A complete occurrence, however it was found: what running it needs."""

    __slots__ = ("inputs", "scalars", "out_ids", "free_ids", "_instrs", "_expand")

    def __init__(self, inputs, scalars, out_ids, free_ids, instrs=None, expand_=None):
        self.inputs = inputs  # value ids, in the block's input order
        self.scalars = scalars  # lifted floats, in order
        self.out_ids = out_ids  # ids the block's outputs are bound to
        self.free_ids = free_ids  # ids the occurrence frees
        self._instrs, self._expand = instrs, expand_

    @property
    def instructions(self) -> list:
        if self._instrs is None:
            self._instrs = self._expand()
        return self._instrs

    @classmethod
    def tracked(cls, block: Block, tracker: Tracker, buf: list) -> Occurrence:
        """An occurrence the engine matched instruction by instruction."""
        names = {n: vid for vid, n in tracker.namer.names.items()}
        return cls(
            tracker.namer.inputs,
            getattr(tracker.namer, "scalars", ()),
            [names[n] for n in block.canon.outputs],
            [ins[1] for ins in buf if ins[0] == FREE],
            instrs=buf,
        )

    @classmethod
    def planned(cls, block: Block, inputs, produced, scalars) -> Occurrence:
        """An occurrence the client matched against the block's plan (a RUN instruction)."""
        return cls(
            inputs,
            scalars,
            [produced[n[1]] for n in block.canon.outputs],
            [inputs[f.k] if f.kind == "i" else produced[f.k] for f in block.free_slots],
            expand_=lambda: expand(block.plan, inputs, produced, scalars),
        )


class Engine:
    """Detects hot blocks in the stream, compiles them, and runs their occurrences."""

    def __init__(self, ex, options, publish):
        self.ex = ex
        self.options = options
        self._publish = publish
        self.events: list[dict] = []
        self.history: list = []  # instructions run eagerly since the last hot occurrence
        self.keys: list = []
        self.paths: list = []  # out paths of history's OP instructions (None for others)
        self.freed_meta: dict[int, tuple] = {}
        self.blocks: dict[str, Block] = {}
        self.by_first: dict[tuple, list[Block]] = {}
        self.lift_first: list[Block] = []  # blocks whose first op has a lifted scalar
        self.trackers: list[Tracker] = []
        self.buf: list = []
        self.gap = -1  # instructions to run before the next occurrence; -1: none expected
        self.expect: Block | None = None
        self.after_barrier = True
        self.speculative = False
        self.next_detect = 0
        self.signal_start: dict[str, int] = {}
        self.jit_open = False  # inside a gt_core.jit call being recorded (a "jit:" signal)
        self.jit_ready: dict[str, str] = {}  # jit call name -> its block, seen twice alike
        self.signal_seen: dict[str, str] = {}
        self._names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._published = 0.0  # perf_counter of the last publish
        self._compiler: CompileProcess | None = None
        self.compiling = 0  # compiles under way (the worker leaves them a core)
        self.cpu_share = None  # the worker process's intra-op threads (worker.cpu_share.CpuShare)
        # Every timed run of a block goes through this one callable, (kind, fn, *args) ->
        # (result, ms): regression checks judge what it measures, and a test that gives it
        # fixed times per kind gets the judge's decision without depending on the machine.
        self.timer = _timed

    # -- plumbing ------------------------------------------------------------------------
    def emit(self, type: str, **fields) -> None:
        e = ev.event(type, **fields)
        with self._lock:  # the compile thread emits too
            self.events.append(e)
        if self.options.debug and (
            type in _DEBUG_LINES
            or (self.options.debug >= 2 and type not in (ev.ITERATION, ev.PLAN))
        ):
            detail = fields.get("reason") or fields.get("seconds") or fields.get("n_ops") or ""
            print(f"gt: {type} {fields.get('signature', '')} {detail}", flush=True)

    def flush_events(self) -> None:
        with self._lock:
            events, self.events = self.events, []
        if events:
            self._published = time.perf_counter()
            self._publish(events)

    def _publish_soon(self) -> None:
        """Publish now unless only iteration timings are pending and some went out just now."""
        events = self.events
        if events and (
            time.perf_counter() - self._published >= _EVENTS_EVERY_S
            or any(e["type"] != ev.ITERATION for e in events)
        ):
            self.flush_events()

    def op_name(self, idx: int) -> str:
        name = self._names.get(idx)
        if name is None:
            name = self._names[idx] = op_name(self.ex.ops[idx])
        return name

    def meta_of(self, vid: int):
        t = self.ex.values.get(vid)
        if t is None:
            return self.freed_meta.get(vid)
        return (tuple(t.shape), t.stride(), t.dtype, t.device)

    def control(self, what: str, value=None):
        if what == "options":
            if value.client_match and not self.options.client_match:
                for block in self.blocks.values():  # the client forgot its plans when it stopped
                    if block.plan is not None and not block.withdrawn:
                        self.emit(ev.PLAN, signature=block.sig, plan=block.plan)
            self.options = value
            compiling = any(b.status == Status.COMPILING for b in self.blocks.values())
            if self._compiler is not None and self.compile_process() is None and not compiling:
                self._compiler.close()  # not needed now (a warm-up under way is cut short)
                self._compiler = None
        elif what == "wait":
            for b in list(self.blocks.values()):
                if b.thread is not None:
                    b.thread.join(value)
            self.flush_events()
        elif what == "jit":  # a jit call's block, if its last two calls made the same one
            block = self.blocks.get(self.signal_seen.get(value))
            if block is not None and self.jit_ready.get(value) == block.sig:
                block.withdrawn = False
                return block.sig, block.plan
        return None

    def close(self) -> None:
        try:
            self._flush_buffer(mismatch=False)
            self.flush_events()
        finally:  # the compile process and its files go, even when the client has gone
            if self._compiler is not None:
                self._compiler.close()

    def compile_process(self) -> CompileProcess | None:
        """Where inductor blocks compile off the critical path, or None (in the worker).

        Background inductor compiles on a CPU worker go to a process of their own (see
        _compile_proc); on a GPU they stay in a thread of the worker (not measured there yet).
        """
        o = self.options
        if not (
            o.compile_process
            and o.background
            and o.backend == "inductor"
            and not o.dynamic
            and self.ex.device.type == "cpu"
        ):
            return None
        with self._lock:
            if self._compiler is None:
                # The client ends it where the worker cannot (the worker killed): see
                # ProcessTransport.death.
                self._compiler = CompileProcess(
                    o.worker_imports,
                    lambda pid, folder: self.emit(ev.WORKER, state="compiler", pid=pid, dir=folder),
                )
            return self._compiler

    def warm(self) -> None:
        """Warm the compile process up (worker start): see CompileProcess.warm."""
        cp = self.compile_process()
        if cp is None:
            return
        with self._busy():
            try:
                cp.warm()
            except Exception:  # the first block's compile reports the same failure, with its reason
                if self.options.debug:
                    traceback.print_exc()

    @contextlib.contextmanager
    def _busy(self):
        with self._lock:
            self.compiling += 1
        try:
            yield
        finally:
            with self._lock:
                self.compiling -= 1

    # -- the stream ----------------------------------------------------------------------
    def feed(self, instrs) -> None:
        for ins in instrs:
            self.step(ins)
            if self.gap < 0 and not self.trackers and len(self.history) >= self.next_detect:
                self._maybe_detect()
        self._publish_soon()

    def step(self, ins) -> None:
        code = ins[0]
        if code == DEFOP:
            self.ex.execute(ins)
            return
        if code == RUN:
            self._run_planned(ins)
            return
        if self.jit_open and code != MARK:
            self._eager(ins)  # a jit call being recorded: its block is the call, see _signal
            return
        if self.trackers:
            if code in BARRIERS:
                self._flush_buffer(mismatch=True, got=ins)
            else:
                self._track(ins)
                return
        elif self.gap <= 0 and (self.by_first or self.lift_first):
            # Expected here (gap 0), or a speculative start: after a mismatch or a change the
            # stream realigns with a known block as soon as one begins again.
            self.speculative = self.gap < 0
            if code not in BARRIERS and self._start(ins):
                return
            self.gap = -1
        elif self.gap > 0:
            self.gap -= 1
        self._eager(ins)
        if code in BARRIERS:
            self._barrier(ins)

    def _eager(self, ins) -> None:
        code = ins[0]
        if code == FREE:
            vid = ins[1]
            t = self.ex.values.get(vid)
            if t is not None:
                self.freed_meta[vid] = (tuple(t.shape), t.stride(), t.dtype, t.device)
        result = self.ex.run_op(ins) if code == OP else self.ex.execute(ins)
        self.history.append(ins)
        self.keys.append(_local_key(ins))
        self.paths.append(_out_paths(result) if code == OP else None)
        self.after_barrier = code in BARRIERS
        if len(self.history) > 2 * self.options.window:
            self._trim()

    def _trim(self) -> None:
        drop = len(self.history) - self.options.window
        del self.history[:drop], self.keys[:drop], self.paths[:drop]
        self.next_detect = max(0, self.next_detect - drop)
        for s in self.signal_start:
            self.signal_start[s] -= drop
        if len(self.freed_meta) > 4 * self.options.window:
            self.freed_meta.clear()

    def _barrier(self, ins) -> None:
        if ins[0] == MARK:
            self._signal(ins[1], ins[2])
        elif ins[0] == SYNC and self.options.compile_all:
            self._compile_segment()
        if self.gap < 0 and not self.trackers:
            self._maybe_detect()

    # -- matching hot occurrences -------------------------------------------------------
    def _start(self, ins) -> bool:
        namer = Namer(self.meta_of)
        try:
            first = namer.entry(ins, self.op_name)
        except (Mismatch, KeyError):
            return False
        cands = [b for b in self.by_first.get(first, ()) if b.tracked] + self.lift_first
        if not cands:
            return False
        self.trackers = [Tracker(b, self.meta_of) for b in cands]
        self._track(ins)
        return True

    def _track(self, ins) -> None:
        self.buf.append(ins)
        alive = [t for t in self.trackers if t.match(ins, self.op_name)]
        if not alive:
            self._flush_buffer(mismatch=True, got=ins)
            return
        self.trackers = alive
        done = next((t for t in alive if t.complete), None)
        if done is not None:
            buf = self.buf
            self._run(done.block, Occurrence.tracked(done.block, done, buf))

    def _run_planned(self, ins) -> None:
        """A RUN from the client: the whole occurrence, if its inputs fit the block."""
        _, sig, inputs, produced, scalars = ins
        if self.trackers:  # instructions before it that began to look like a block
            self._flush_buffer(mismatch=False)
        block = self.blocks[sig]
        meta = block.canon.input_meta
        if (
            len(inputs) != len(meta)
            or len(produced) != block.n_produced
            or any(self.meta_of(v) != m for v, m in zip(inputs, meta, strict=True))
        ):
            # Same ops, other shapes (a last smaller batch, a new size): the instructions
            # take the ordinary path, and the client stops using this plan.
            block.withdrawn = True
            self.emit(ev.PLAN, signature=sig, plan=None)
            for x in expand(block.plan, inputs, produced, scalars):
                self.step(x)
            return
        self._run(block, Occurrence.planned(block, inputs, produced, scalars))

    def _flush_buffer(self, mismatch: bool, got=None) -> None:
        """Run buffered instructions eagerly: the occurrence did not complete."""
        if mismatch and self.trackers and self.buf and not self.speculative:
            t = max(self.trackers, key=lambda t: t.pos)
            if t.pos > 0 or len(self.buf) > 1:
                entries = t.block.canon.entries
                expected = entries[t.pos][1] if t.pos < len(entries) else "end"
                self.emit(
                    ev.MISMATCH,
                    signature=t.block.sig,
                    position=t.pos,
                    expected=str(expected),
                    got=self._describe(got),
                )
        buf, self.buf, self.trackers = self.buf, [], []
        self.gap = -1
        for ins in buf:
            self._eager(ins)

    def _describe(self, ins) -> str:
        if ins is None:
            return "end of stream"
        if ins[0] == OP:
            return self.op_name(ins[1])
        return {FREE: "free", SYNC: "sync point", MARK: "signal"}.get(ins[0], "upload/seed")

    def _run(self, block: Block, occ: Occurrence) -> None:
        """A complete occurrence: run it compiled if we can, else its instructions eagerly."""
        self.buf, self.trackers = [], []
        self.history.clear(), self.keys.clear(), self.paths.clear()
        self.next_detect = 0
        self.gap = block.gap
        fn = block.fn
        if fn is not None and block.status == Status.COMPILED and not block.probe:
            try:
                self._run_compiled(block, occ, fn)
            except Exception as exc:
                block.status, block.fn = Status.FAILED, None
                if block.mutates:
                    self._failed_midway(block, occ, exc)
                    return
                self.emit(ev.FALLBACK, signature=block.sig, reason=_reason(exc))
            else:
                self._check_regression(block)
                return
        ms = self._run_eager(block, occ)
        if ms is None:
            return
        if block.status == Status.COMPILING:
            # Slowed by the compile beside it: shown as such, never an eager baseline.
            self.emit(ev.ITERATION, signature=block.sig, kind="compiling", ms=ms)
            return
        block.eager_ms.append(ms)
        block.samples.setdefault(("eager", self._condition()), self._timed()).append(ms)
        self.emit(ev.ITERATION, signature=block.sig, kind="eager", ms=ms)
        if block.probe:
            block.probe -= 1
            block.probed += 1
            if not block.probe:
                self._check_regression(block)
        if block.status == Status.HOT and self.options.auto_compile and len(block.eager_ms) >= 2:
            self._compile(block)

    def _run_eager(self, block: Block, occ: Occurrence) -> float | None:
        """Run an occurrence eagerly; its milliseconds, or None if it failed midway.

        As the block's eager graph where there is one: the same ops with the same arguments
        in the same order as its instructions, so the same results, but called from FX's
        generated code rather than one instruction at a time (the MLP step at batch 8: 0.20
        instead of 0.36 ms here). Else, or where an input is missing (an op failed earlier),
        its instructions.
        """
        fn = block.eager_fn
        if fn is not None:
            values = self.ex.values
            try:
                inputs = [values[i] for i in occ.inputs]
            except KeyError:
                fn = None
        if fn is None:
            return self.timer("eager", self._run_eagerly, occ.instructions)[1]
        try:
            outs, ms = self.timer("eager", fn, *inputs, *occ.scalars)
        except Exception as exc:
            block.eager_fn = None  # its instructions from now on
            if not block.mutates:  # nothing written yet: the instructions say which op failed
                return self.timer("eager", self._run_eagerly, occ.instructions)[1]
            self.ex.poisoned.update(occ.out_ids)
            self._drop(occ.free_ids)
            if self.ex.error is None:
                exc.add_note(
                    f"(gt worker: raised while running hot path {block.sig} eagerly; the "
                    "tensors it updates in place, parameters and optimizer state, may be "
                    "partly updated)"
                )
                self.ex.error = exc
            return None
        self._ran(block, occ, outs)
        return ms

    def _run_eagerly(self, buf) -> None:
        for ins in buf:
            if ins[0] == OP:
                self.ex.run_op(ins)
            else:
                self.ex.execute(ins)

    def _failed_midway(self, block: Block, occ: Occurrence, exc: Exception) -> None:
        """A compiled run of a block with in-place updates failed: never re-run it silently.

        Some inputs (parameters, optimizer state) may already hold this step's update, so
        running the instructions again could apply it twice. The user hears of it at the
        next sync; the outputs of this occurrence are marked as never computed.
        """
        reason = _reason(exc)
        self.emit(ev.FALLBACK, signature=block.sig, reason=reason, midway=True)
        self.ex.poisoned.update(occ.out_ids)
        self._drop(occ.free_ids)
        if self.ex.error is None:
            self.ex.error = CompiledRunFailed(
                f"gt: the compiled hot path {block.sig} failed while running ({reason}). It "
                "updates tensors in place (parameters, optimizer state), which may now be "
                "partly updated, so it was not re-run eagerly. gt runs this block eagerly from "
                "now on; re-create the state (re-run the cell that builds the model and "
                "optimizer) for exact results."
            )

    def _run_compiled(self, block: Block, occ: Occurrence, fn) -> None:
        values = self.ex.values
        inputs = [values[i] for i in occ.inputs]
        if block.scalar_dtypes:
            dev = self.ex.device
            inputs += [
                torch.tensor(v, dtype=dt, device=dev)
                for v, dt in zip(occ.scalars, block.scalar_dtypes, strict=True)
            ]
        share = self.cpu_share
        n = share.choose(block.sig) if share is not None else None
        outs, ms = self.timer("compiled", fn, *inputs)
        self._ran(block, occ, outs)
        block.compiled_ms.append(ms)
        if share is None or share.learn(block.sig, n, ms):
            # (a run trying the other thread count is no sample of the compiled block)
            block.samples.setdefault(("compiled", self._condition()), self._timed()).append(ms)
        self.emit(ev.ITERATION, signature=block.sig, kind="compiled", ms=ms)

    def _timed(self) -> deque:
        """A bounded series of timings, long enough for a regression check."""
        return deque(maxlen=max(_TIMED_RUNS, self.options.regression_samples))

    def _condition(self):
        """What the worker's CPU was shared with during a run: timings compare within one."""
        share = self.cpu_share
        return None if share is None else (share.waits, self.compiling > 0)

    def _ran(self, block: Block, occ: Occurrence, outs) -> None:
        """An occurrence ran as one call: its outputs bound, its frees dropped."""
        values = self.ex.values
        for vid, value in zip(occ.out_ids, outs, strict=True):
            values[vid] = value
        self._drop(occ.free_ids)
        self.ex.executed += len(block.canon.entries)

    def _drop(self, ids) -> None:
        """Drop the values an occurrence frees (its ops ran as one call, or not at all)."""
        values = self.ex.values
        for vid in ids:
            values.pop(vid, None)

    def _check_regression(self, block: Block) -> None:
        if block.judged:
            return
        cond = self._condition()
        compiled = block.samples.get(("compiled", cond), ())
        if len(compiled) < self.options.regression_samples:
            return
        eager = block.samples.get(("eager", cond), ())
        if len(eager) < _BASELINE_RUNS:
            if block.probed >= _MAX_PROBES:  # the condition keeps changing: all runs
                self._judge(block, block.eager_ms, block.compiled_ms, "all of them")
                return
            # No clean eager run timed as the compiled ones ran (compiled in the background
            # before one was: runs beside a compile are slowed by it; or the client waited
            # for those and records beside these, which leaves the worker a core fewer):
            # time a few eager occurrences now, then judge.
            block.probe = _BASELINE_RUNS - len(eager)
            return
        self._judge(block, eager, compiled, _in_words(cond))

    def _judge(self, block: Block, eager_ms, compiled_ms, runs: str = "") -> None:
        """Revert to eager if the compiled median is slower than the eager one.

        ``runs``: which runs were compared, in words (the reason says it).
        """
        block.judged = True
        n = len(compiled_ms)
        eager = statistics.median(eager_ms)
        comp = statistics.median(compiled_ms)
        if comp > eager * 1.05:
            block.status, block.fn = Status.REVERTED, None
            self.emit(
                ev.REVERT,
                signature=block.sig,
                eager_ms=eager,
                compiled_ms=comp,
                reason=f"compiled median {comp:.3f} ms is slower than eager {eager:.3f} ms over {n} runs"
                + (f" ({runs})" if runs else ""),
            )

    # -- detection -----------------------------------------------------------------------
    def _maybe_detect(self) -> None:
        o = self.options
        if not o.auto_compile and not o.signals:
            return
        n = len(self.keys)
        if n < max(self.next_detect, o.threshold * o.min_seq) or not o.auto_compile:
            return
        K, t = self.keys, o.threshold
        last = K[-1]
        for p in range(o.min_seq, n // t + 1):
            if K[n - 1 - p] == last and K[n - t * p : n - p] == K[n - (t - 1) * p : n]:
                if self._detect_period(p):
                    return
                break
        self.next_detect = n + max(o.min_seq, 32)

    def _detect_period(self, p: int) -> bool:
        n, H = len(self.history), self.history
        # Cut at sync points, and at ops whose arguments change from one period to the next,
        # unless only floats change where they can be lifted into tensor inputs.
        lifts, barriers = self._changes(p)
        if barriers:
            start, length = _longest_segment(barriers, n - p, p)
        else:
            start, length = self._best_cut(p), p
        if length < self.options.min_seq:
            self.next_detect = n + p
            return False
        # the most recent complete occurrences of [start, start + length), oldest first
        begin = start if start + length <= n else start - p
        verified = n - self.options.threshold * p  # the keys are periodic from here on
        occ = [
            begin - k * p
            for k in range(self.options.threshold - 1, -1, -1)
            if begin - k * p >= verified
        ]
        lift = {}
        for r in range(length):
            j = start + r if start + r < n else start + r - p
            if j in lifts:
                lift[r] = lifts[j]
        canons = []
        for b in occ:
            try:
                canon, namer = self._canonicalize(H[b : b + length], lift)
            except Mismatch:
                return False
            canons.append(canon)
        if len({c.id for c in canons}) != 1 or len(occ) < 2:
            self.next_detect = n + p
            return False
        canon = canons[-1]
        paths = [x for x in self.paths[begin : begin + length] if x is not None]
        self.gap = start + p - n
        if self.gap < 0:
            self.gap += p
        existing = self.blocks.get(canon.id)
        if existing is None:
            dtypes = tuple(namer.dtypes) if lift else ()
            block = Block(
                canon,
                paths,
                self._ops_by_name(),
                p,
                lift=lift,
                scalar_dtypes=dtypes,
                value_meta=self._value_meta(namer),
            )
            self._register(block)
            self._make_hot(block, occurrences=len(occ))
        return True

    def _changes(self, p: int) -> tuple[dict, list[int]]:
        """Over the last period: {index: {path: dtype}} of liftable floats, and the barriers."""
        n, H, t = len(self.history), self.history, self.options.threshold
        lifts: dict[int, dict] = {}
        barriers = []
        for i in range(n - p, n):
            ins = H[i]
            if ins[0] in BARRIERS or (ins[0] == OP and ins[1] in self.ex.unresolved):
                # (an op the worker cannot find fails every time: no block contains it)
                barriers.append(i)
                continue
            paths: dict = {}
            for k in range(1, t):
                a, b = H[i - (k - 1) * p], H[i - k * p] if i - k * p >= 0 else None
                if b is None or _exact(a) == _exact(b):
                    continue
                got = (
                    lift_positions(self.ex.ops[a[1]], a, b, self.meta_of)
                    if a[0] == OP == b[0] and a[1] == b[1]
                    else None
                )
                if got is None:
                    barriers.append(i)
                    break
                paths.update(got)
            else:
                if paths:
                    lifts[i] = paths
        return lifts, barriers

    def _canonicalize(self, instrs, lift: dict):
        if not lift:
            return canonicalize(instrs, self.meta_of, self.block_op_name)
        namer = LiftNamer(self.meta_of, lift)
        entries = tuple(namer.entry(ins, self.block_op_name) for ins in instrs)
        return _finish(entries, namer), namer

    def _best_cut(self, p: int) -> int:
        """The rotation of the period where the fewest values cross the block boundary."""
        n, H = len(self.history), self.history
        # Judge boundaries in a period with a whole period of context on each side, so
        # lifetimes are seen entirely; fall back to the last period when there is no room.
        lo = max(0, n - 3 * p)
        mid = n - 2 * p if n - 3 * p >= 0 else n - p
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for i in range(lo, n):
            for vid in _ids(H[i]):
                first.setdefault(vid, i)
                last[vid] = i
        delta = [0] * (n - lo + 1)
        for vid, f in first.items():
            if last[vid] > f:
                delta[f + 1 - lo] += 1
                delta[last[vid] + 1 - lo] -= 1
        best, best_at, live = None, mid, 0
        for i in range(lo, mid + p):
            live += delta[i - lo]
            if i >= mid and (best is None or live < best):
                best, best_at = live, i
        return best_at + (n - p - mid)  # the same phase, in the last period

    def _value_meta(self, namer) -> dict:
        """{canonical value name: {"shape", "dtype"}} of one occurrence: what the graph shows."""
        out = {}
        for vid, name in namer.names.items():
            m = self.meta_of(vid)
            if m is not None:
                out[_name(name)] = {
                    "shape": list(m[0]),
                    "dtype": str(m[2]).removeprefix("torch."),
                }
        return out

    def _ops_by_name(self) -> dict:
        # Without unresolved ops: the compile process resolves every name it is given.
        unresolved = self.ex.unresolved
        return {self.op_name(i): op for i, op in self.ex.ops.items() if i not in unresolved}

    def block_op_name(self, idx: int) -> str:
        """op_name for canonicalizing a block: an unresolved op never enters one."""
        if idx in self.ex.unresolved:
            raise Mismatch(f"{self.op_name(idx)} is not known to the worker")
        return self.op_name(idx)

    def _register(self, block: Block) -> None:
        self.blocks[block.sig] = block
        block.eager_fn = self._eager_graph(block)
        index = {self.op_name(i): i for i in self.ex.ops}
        block.plan = make_plan(block.canon, index, len(block.scalar_dtypes))
        block.free_slots = [e[1] for e in block.plan.entries if e[0] == "free"]
        if self.options.client_match:
            self.emit(ev.PLAN, signature=block.sig, plan=block.plan)
        if 0 in block.lift:
            self.lift_first.append(block)
        else:
            self.by_first.setdefault(block.canon.entries[0], []).append(block)

    def _eager_graph(self, block: Block):
        """The block's eager form (build_graph without lifting or rewrites), or None.

        Not on another device where an op names one: the executor places such ops on the
        worker's device (Executor._place); the graph would keep the client's.
        """
        if self.ex.device.type != "cpu" and any(
            e[0] == "op" and any(name == "device" for name, _ in e[3]) for e in block.canon.entries
        ):
            return None
        try:
            n = len(block.scalar_dtypes)
            return build_graph(block.canon, block.ops, block.out_paths, False, n, lift=False)
        except Exception:  # the instructions run it (a form FX cannot express)
            if self.options.debug:
                traceback.print_exc()
            return None

    def _make_hot(self, block: Block, occurrences: int = 2) -> None:
        block.status = Status.HOT
        data = block.canon.to_data()
        self.emit(
            ev.DETECTED,
            signature=block.sig,
            ops=block.canon.ops,
            n_ops=len(block.canon.ops),
            n_instructions=len(block.canon.entries),
            occurrences=occurrences,
            signal=block.signal,
            canonical=data,
            values=block.value_meta,
        )
        for other in self.blocks.values():
            if other is not block and other.canon.ops == block.canon.ops:
                from gt_core.stream.canonical import diff

                self.emit(
                    ev.RECOMPILE,
                    signature=block.sig,
                    previous=other.sig,
                    reason=diff(other.canon.to_data(), data) or "same form",
                )
                break
        if (
            block.signal
            or self.options.compile_all
            or (self.options.auto_compile and self.options.background)
        ):
            self._compile(block)
        # Compiling on the critical path: first time a couple of eager occurrences, the
        # baseline that regression detection and the speedup compare against (see _run).

    # -- compiling -----------------------------------------------------------------------
    def _compile(self, block: Block) -> None:
        o = self.options
        block.status = Status.COMPILING
        cp = self.compile_process()
        self.emit(
            ev.COMPILE_STARTED,
            signature=block.sig,
            backend=o.backend,
            mode=o.mode,
            where="process" if cp else "thread" if o.background else "inline",
        )

        def work():
            with self._busy():
                self._compile_now(block, cp, o)
            if (
                threading.current_thread() is not threading.main_thread()
                and block.thread is not None
            ):
                self.flush_events()

        if o.background:
            if self._graphs(o):
                replay_here()  # before the compile thread imports CUDA graph trees
            block.thread = threading.Thread(
                target=_no_grad(work), name=f"gt-compile-{block.sig}", daemon=True
            )
            block.thread.start()
        else:
            _no_grad(work)()

    def _graphs(self, o: Options) -> bool:
        """Whether a block compiled with ``o`` is recorded as CUDA graphs (see compile_block);
        with dynamic shapes Dynamo compiles at the first call, out of gt's sight."""
        return o.backend == "inductor" and not o.dynamic and uses_cudagraphs(o.mode, self.ex.device)

    def _compile_now(self, block: Block, cp: CompileProcess | None, o: Options) -> None:
        graphs = self._graphs(o)
        try:
            with cudagraph_skips() if graphs else contextlib.nullcontext() as skips:
                fn, seconds = self._compiled(block, cp, o)
        except Exception as exc:
            block.status = Status.FAILED
            self.emit(ev.COMPILE_FAILED, signature=block.sig, reason=_reason(exc))
            if o.debug:
                traceback.print_exc()
        else:
            block.fn = fn
            if block.status == Status.COMPILING:
                block.status = Status.COMPILED
            extra = {}
            if graphs:  # CUDA graphs asked for: whether inductor records them, and if not, why
                extra = {"cudagraphs": "skipped" if skips else "used", "cudagraph_skips": skips}
            self.emit(ev.COMPILE_FINISHED, signature=block.sig, seconds=seconds, **extra)

    def _compiled(self, block: Block, cp: CompileProcess | None, o: Options):
        """(compiled callable, seconds): in the compile process, or here."""
        n_scalars = len(block.scalar_dtypes)
        if cp is not None:
            return cp.compile_block(
                block.canon, block.ops, block.out_paths, block.scalar_dtypes, self.ex.device, o.mode
            )
        gm = build_graph(block.canon, block.ops, block.out_paths, o.backend == "inductor", n_scalars)
        examples = [
            torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for shape, stride, dtype, device in block.canon.input_meta
        ]
        examples += [torch.zeros((), dtype=dt, device=self.ex.device) for dt in block.scalar_dtypes]
        return compile_block(gm, examples, o.backend, o.mode, o.dynamic)

    # -- signals and compile-everything -------------------------------------------------
    def _signal(self, name: str, phase: str) -> None:
        jit = name.startswith(JIT_SIGNAL)
        if not jit:  # (a jit call's marks are its own events, published by the client)
            self.emit(ev.SIGNAL, name=name, phase=phase)
        n = len(self.history)
        if phase == "enter":
            self.signal_start[name] = n
            self.jit_open = jit
            return
        self.jit_open = False
        start = self.signal_start.pop(name, None)
        if start is None or start < 0:
            return
        seg = [i for i in range(start, n - 1) if self.history[i][0] in (OP, FREE)]
        if not seg or seg != list(range(seg[0], seg[-1] + 1)):
            return
        try:
            canon, namer = canonicalize(
                [self.history[i] for i in seg], self.meta_of, self.block_op_name
            )
        except Mismatch:
            return
        spec = {"compile": True} if jit else self.options.signals.get(name, {})
        if canon.id in self.blocks:
            if jit and self.signal_seen.get(name) == canon.id:
                self._jit_block(name, self.blocks[canon.id])
            self.signal_seen[name] = canon.id
            return
        if self.signal_seen.get(name) == canon.id and spec.get("compile"):
            paths = [self.paths[i] for i in seg if self.paths[i] is not None]
            block = Block(
                canon,
                paths,
                self._ops_by_name(),
                len(seg) + 2,
                signal=name,
                value_meta=self._value_meta(namer),
            )
            self._register(block)
            self._make_hot(block)
            if jit:
                self._jit_block(name, block)
            else:
                self.emit(ev.SIGNAL, name=name, phase="compile", signature=canon.id)
        elif not jit and self.signal_seen.get(name) != canon.id:
            # Seen once: recorded, waiting for a second occurrence (or the threshold).
            self.emit(
                ev.RECORDING, signature=canon.id, ops=canon.ops, n_ops=len(canon.ops), signal=name
            )
        self.signal_seen[name] = canon.id

    def _jit_block(self, name: str, block: Block) -> None:
        """A jit call's block, seen twice alike: the client asks for its plan (control "jit")
        and replays it by RUNs."""
        self.jit_ready[name] = block.sig

    def _compile_segment(self) -> None:
        """GT_COMPILE: the instructions since the previous sync point become a block at once."""
        n = len(self.history)
        i = n - 1
        while i > 0 and self.history[i - 1][0] not in BARRIERS:
            i -= 1
        seg = [k for k in range(i, n - 1) if self.history[k][0] in (OP, FREE)]
        if len(seg) < 1:
            return
        try:
            canon, namer = canonicalize(
                [self.history[k] for k in seg], self.meta_of, self.block_op_name
            )
        except Mismatch:
            return
        if canon.id not in self.blocks:
            paths = [self.paths[k] for k in seg if self.paths[k] is not None]
            block = Block(
                canon, paths, self._ops_by_name(), len(seg) + 1, value_meta=self._value_meta(namer)
            )
            self._register(block)
            self._make_hot(block, occurrences=1)


def _in_words(condition) -> str:
    """A CPU condition (Engine._condition) as the revert reason names it."""
    if condition is None:
        return ""
    waits, compiling = condition
    words = "the client waiting for each" if waits else "each beside the client's recording"
    return words + (", another block compiling" if compiling else "")


def _ids(ins):
    if ins[0] == FREE:
        return (ins[1],)
    if ins[0] != OP:
        return ()
    out = []
    _collect(ins[2], out)
    _collect(tuple(ins[3].values()), out)
    out.extend(ins[4])
    return out


def _collect(a, out) -> None:
    t = type(a)
    if t is Ref:
        out.append(a.id)
    elif t is list or t is tuple:
        for x in a:
            _collect(x, out)


def _longest_segment(barriers: list[int], lo: int, p: int) -> tuple[int, int]:
    """(start, length) of the longest barrier-free run in one period, wrapping around."""
    best = (barriers[0] + 1, 0)
    for j, b in enumerate(barriers):
        nxt = barriers[j + 1] if j + 1 < len(barriers) else barriers[0] + p
        length = nxt - b - 1
        if length > best[1]:
            best = (b + 1, length)
    start, length = best
    if start >= lo + p:
        start -= p
    return start, length


def _reason(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) < 2000 else text[:2000] + " …"


def _no_grad(fn):
    def run():
        with torch.no_grad():
            fn()

    return run
