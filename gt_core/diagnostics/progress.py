"""A compile of the user's while it runs: which function, which phase, the time so far, and
whether inductor's cache served it, as ``user.compiling`` events a live dashboard draws.

Dynamo times every phase of a compile (``dynamo_timed``) and tells its chromium event
logger where each begins and ends, on the compiling thread. :class:`Progress` keeps each
thread's open phases; a phase opened with none open begins a compile (a frame's, or the
backward's, which AOT autograd compiles at the first backward). A ticker thread publishes
the compiles under way every ``every_s`` (the compiling thread is busy compiling), and each
compile once more as it ends (``done``). The phase is the innermost one named in
:data:`PHASES`; the cache: inductor generates code (``fx_codegen_and_compile``) only where
its FX graph cache missed, so a compile that ran inductor without it was served by the
cache.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gt_core.diagnostics import stance as _stance
from gt_core.diagnostics.names import in_gt
from gt_core.observe import events as ev

__all__ = ["PHASES", "Progress", "phase_words"]

# Dynamo's phase names (prefixes) -> the words a user reads; the innermost match is shown.
PHASES = (
    ("bytecode_tracing", "Dynamo: tracing the Python"),
    ("build_guards", "Dynamo: building the guards"),
    ("insert_deferred_runtime_asserts", "Dynamo: tracing the Python"),
    ("create_aot_dispatcher_function", "AOT autograd: tracing forward and backward"),
    ("aot_", "AOT autograd: tracing forward and backward"),
    ("min_cut_rematerialization_partition", "AOT autograd: partitioning"),
    ("_recursive_", "inductor: graph passes"),
    ("GraphLowering.run", "inductor: lowering"),
    ("Scheduler.", "inductor: scheduling and fusing"),
    ("GraphLowering.codegen", "inductor: generating code"),
    ("PythonWrapperCodegen", "inductor: generating code"),
    ("GraphLowering.compile_to_fn", "inductor: building the kernels (C++/Triton)"),
    ("PyCodeCache.load_by_key_path", "inductor: building the kernels (C++/Triton)"),
    ("async_compile", "inductor: building the kernels (C++/Triton)"),
    ("compile_file", "inductor: building the kernels (C++/Triton)"),
    ("fx_codegen_and_compile", "inductor: compiling the graph"),
    ("compile_fx_inner", "inductor: looking up its cache"),
    ("backend_compile", "the backend"),
    ("entire_backward_compile", "the backward's compile"),
    ("compile_attempt", "Dynamo"),
    ("entire_frame_compile", "Dynamo"),
    ("dynamo", "Dynamo"),
)
_CODEGEN, _INDUCTOR = "fx_codegen_and_compile", "compile_fx_inner"


def phase_words(open_phases: list[str]) -> str:
    """The innermost of ``open_phases`` (outermost first) that :data:`PHASES` names."""
    for name in reversed(open_phases):
        for prefix, words in PHASES:
            if name.startswith(prefix):
                return words
    return "compiling"


@dataclass
class _Compile:
    function: str
    backward: bool
    t0: float
    phases: list = field(default_factory=list)  # the open phases, outermost first
    seen: set = field(default_factory=set)  # every phase name opened

    def cache(self) -> str | None:
        """What inductor's FX graph cache did, once it is known."""
        if _CODEGEN in self.seen:
            return "miss"
        return None


class Progress:
    """The compiles under way on every thread, published as ``user.compiling`` events.

    ``clock`` is injectable and :meth:`tick` callable directly: tests drive it without a
    ticker thread or sleeps.
    """

    def __init__(
        self, emit: Callable, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic
    ):
        self.emit, self.every_s, self.clock = emit, every_s, clock
        self.lock = threading.Lock()
        self.open: dict[int, _Compile] = {}  # thread id -> its compile under way
        self.last: dict[int, float] = {}  # thread id -> when its compile was last published
        self.function = "?"  # the function compiled last (a backward's, on another thread)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- Dynamo's phases (on the compiling thread) ----------------------------------------
    def started(self, name: str) -> None:
        if in_gt():
            return
        tid = threading.get_ident()
        with self.lock:
            c = self.open.get(tid)
            if c is None:
                backward = name.startswith("entire_backward_compile")
                fn = _stance.entry_name() or self.function
                self.function = fn
                c = self.open[tid] = _Compile(fn, backward, self.clock())
                self.last[tid] = c.t0
                first = True
            else:
                first = False
            c.phases.append(name)
            c.seen.add(name)
        if first:
            self._publish(c)

    def ended(self, name: str) -> None:
        tid = threading.get_ident()
        with self.lock:
            c = self.open.get(tid)
            if c is None or name not in c.phases:
                return
            del c.phases[c.phases.index(name) :]  # (and any phase left open inside it)
            if c.phases:
                return
            del self.open[tid]
            self.last.pop(tid, None)
        self._publish(c, done=True)

    # -- publishing -----------------------------------------------------------------------
    def tick(self) -> None:
        """Publish each compile under way not published for ``every_s``."""
        now = self.clock()
        with self.lock:
            due = [(tid, c) for tid, c in self.open.items() if now - self.last[tid] >= self.every_s]
            for tid, _ in due:
                self.last[tid] = now
        for _, c in due:
            self._publish(c)

    def _publish(self, c: _Compile, done: bool = False) -> None:
        phase = "done" if done else phase_words(list(c.phases))
        cache = c.cache()
        if done and cache is None and _INDUCTOR in c.seen:
            cache = "hit"
        self.emit(
            ev.USER_COMPILING,
            function=c.function,
            backward=c.backward,
            phase=phase,
            seconds=round(self.clock() - c.t0, 3),
            cache=cache,
            done=done,
        )

    # -- the ticker -----------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gt-compile-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(self.every_s / 2, 0.5)):
            try:
                self.tick()
            except Exception:  # a progress line must never break a compile
                pass

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
