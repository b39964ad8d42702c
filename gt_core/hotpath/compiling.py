"""Compile scheduling: where a hot block compiles (compile process, thread, or inline) and
what its outcome is reported as (finished, with or without CUDA graphs, or failed).
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback

import torch

from gt_core.compile import aliases, explain, repair
from gt_core.compile.lower import (
    build_graph,
    compile_block,
    cudagraph_skips,
    replay_here,
    uses_cudagraphs,
)
from gt_core.compile.process import CompileCancelled, CompileProcess
from gt_core.compile.rng import keep_rng_in_threads
from gt_core.hotpath.blocks import Block
from gt_core.hotpath.outbox import reason
from gt_core.hotpath.part import Part
from gt_core.observe import events as ev
from gt_core.observe.report import Status
from gt_core.options import Options

__all__ = ["Compiler"]


# Dynamo's state is process-global: two compiles at once in one process fail
# ("CURRENT_PATCHER is None"), so compiles in this process take turns, whatever thread runs
# them (the compile process has one job at a time of its own).
_DYNAMO = threading.Lock()

# How long close() waits for the threads compiling. One waiting on the compile process ends
# as soon as the process is closed; one compiling in the worker cannot be stopped and may
# take minutes, so the worker's exit does not wait for it (see gt_core.worker_process.ending).
_END_S = 1.0


class Compiler(Part):
    """Compiles hot blocks off the critical path where the options allow, and counts them."""

    def __init__(self, device: torch.device, outbox, options):
        self.device = device
        self.outbox = outbox
        self.options = options
        self.compiling = 0  # compiles under way (the worker leaves them a core)
        # Whether an outcome holds on every rank of a worker group (see gt_core.worker_process.group);
        # one worker: as it is.
        self.agree = _alone
        # A worker group's sharding (the executor's ShardPolicy), or None: see _examples.
        self.sharding = None
        self._process: CompileProcess | None = None
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []  # compiles and the warm-up: close joins them

    def joined(self, agree) -> None:
        """A worker group's rank: ``agree(ok)`` is whether a compile held on every rank."""
        self.agree = agree

    def shard_with(self, policy) -> None:
        """A sharding group's rank: its graphs' examples are laid out by ``policy``."""
        self.sharding = policy

    def process(self) -> CompileProcess | None:
        """Where inductor blocks compile off the critical path, or None (in the worker).

        Background inductor compiles on a CPU worker go to a process of their own (see
        CompileProcess); on a GPU they stay in a thread of the worker (not measured there yet).
        """
        o = self.options
        if not (
            o.compile_process
            and o.background
            and o.backend == "inductor"
            and not o.dynamic
            and self.device.type == "cpu"
        ):
            return None
        with self._lock:
            if self._process is None:
                # The client ends it where the worker cannot (the worker killed): see
                # ProcessTransport.death.
                emit = self.outbox.emit
                self._process = CompileProcess(
                    o.worker_imports,
                    lambda pid, folder: emit(ev.WORKER, state="compiler", pid=pid, dir=folder),
                )
            return self._process

    def warm_soon(self) -> None:
        """Warm the compile process up in a thread of its own (worker start)."""
        self._thread(self.warm, "gt-compile-warm").start()

    def warm(self) -> None:
        """Warm the compile process up (worker start): see CompileProcess.warm."""
        cp = self.process()
        if cp is None:
            return
        with self._busy():
            try:
                cp.warm()
            except Exception:  # the first block's compile reports the same failure, with its reason
                if self.options.debug:
                    traceback.print_exc()

    def release_unneeded(self, blocks) -> None:
        """Close the compile process if the options no longer use it and nothing compiles
        (a warm-up under way is cut short)."""
        compiling = any(b.status == Status.COMPILING for b in blocks)
        if self._process is not None and self.process() is None and not compiling:
            self._process.close()
            self._process = None

    def close(self) -> None:
        """End the compile process, then give the threads compiling a moment (_END_S) to end:
        an interpreter torn down under a thread inside torch's C++ code aborts ("terminate
        called without an active exception")."""
        if self._process is not None:
            self._process.close()
        with self._lock:
            threads = list(self._threads)
        end = time.monotonic() + _END_S
        for t in threads:
            if t.is_alive() and t is not threading.current_thread():
                t.join(max(0.0, end - time.monotonic()))

    def _thread(self, target, name: str) -> threading.Thread:
        """A thread (not started) that runs ``target``; close() waits for it."""
        t = threading.Thread(target=target, name=name, daemon=True)
        with self._lock:
            self._threads = [u for u in self._threads if u.is_alive() or u.ident is None]
            self._threads.append(t)
        return t

    @contextlib.contextmanager
    def _busy(self):
        with self._lock:
            self.compiling += 1
        try:
            yield
        finally:
            with self._lock:
                self.compiling -= 1

    def schedule(self, block: Block) -> None:
        """Compile ``block``: in a thread (that may use the compile process), or now."""
        o = self.options
        block.move(Status.COMPILING)
        cp = self.process()
        self.outbox.emit(
            ev.COMPILE_STARTED,
            signature=block.sig,
            backend=o.backend,
            mode=o.mode,
            dynamic=o.dynamic,
            where="process" if cp else "thread" if o.background else "inline",
        )

        def work():
            with self._busy():
                self._compile_and_report(block, cp, o)
            if (
                threading.current_thread() is not threading.main_thread()
                and block.thread is not None
            ):
                self.outbox.flush()

        if o.background:
            keep_rng_in_threads("gt-compile-")  # (a compile must not rewind the worker's draws)
            if self._graphs(o):
                replay_here()  # before the compile thread imports CUDA graph trees
            block.compiles_in(self._thread(_no_grad(work), f"gt-compile-{block.sig}"))
            block.thread.start()
        else:
            _no_grad(work)()

    def _graphs(self, o: Options) -> bool:
        """Whether a block compiled with ``o`` is recorded as CUDA graphs (see compile_block);
        with dynamic shapes Dynamo compiles at the first call, out of gt's sight."""
        return o.backend == "inductor" and not o.dynamic and uses_cudagraphs(o.mode, self.device)

    def _compile_and_report(self, block: Block, cp: CompileProcess | None, o: Options) -> None:
        """Compile, set the block's function and status, and publish the outcome."""
        graphs = self._graphs(o)
        failure = None
        t0 = time.perf_counter()
        with repair.evictions() as evicted:
            try:
                with cudagraph_skips() if graphs else contextlib.nullcontext() as skips:
                    fn, seconds, info = self._compiled_fn(block, cp, o)
            except CompileCancelled:
                self._cancelled(block, time.perf_counter() - t0)
                return
            except Exception as exc:
                failure = exc
        for e in evicted:  # damaged files of inductor's cache it removed first (see repair)
            self.outbox.emit(ev.CACHE_EVICTED, signature=block.sig, **e)
        if not self.agree(failure is None) and failure is None:  # (a worker group's ranks)
            failure = RuntimeError("the compile failed on another rank of the worker group")
        if failure is not None:
            block.move(Status.FAILED)
            self.outbox.emit(ev.COMPILE_FAILED, signature=block.sig, reason=reason(failure))
            if o.debug:
                traceback.print_exception(failure)
        else:
            block.compiled(fn)
            extra = {}
            if graphs:  # CUDA graphs asked for: whether inductor records them, and if not, why
                extra = {"cudagraphs": "skipped" if skips else "used", "cudagraph_skips": skips}
            if any(p is not None for p in block.placements or ()):  # (a sharding group's)
                extra["placements"] = _placements(block.placements)
            self.outbox.emit(
                ev.COMPILE_FINISHED, signature=block.sig, seconds=seconds, **info, **extra
            )

    def _cancelled(self, block: Block, seconds: float) -> None:
        """``block`` was retired while it compiled: hot again, to compile if it runs again
        (revived); the cores its compile held are the loop's."""
        block.move(Status.HOT)
        block.compile_at_next_run()
        r = block.retirement  # (read once: the engine's thread may revive it meanwhile)
        why = f"its hot path was retired ({r.reason if r else None}) while it compiled"
        self.outbox.emit(ev.COMPILE_CANCELLED, signature=block.sig, reason=why, seconds=seconds)

    def _compiled_fn(self, block: Block, cp: CompileProcess | None, o: Options):
        """(compiled callable, seconds, info: its code, phases, cache use): in the compile
        process, or here (where a compile cut short left damaged files in inductor's cache,
        they are removed and it compiles again)."""
        if cp is not None:
            return cp.compile_block(
                block.form.canon,
                block.form.ops,
                block.form.out_paths,
                block.form.scalar_dtypes,
                self.device,
                o.mode,
                block.aliases,
                wanted=lambda: block.retirement is None,
            )
        if block.retirement is not None:
            raise CompileCancelled("no longer wanted: not started")
        return repair.retrying(lambda: self._compile_here(block, o))

    def _compile_here(self, block: Block, o: Options):
        t0 = time.perf_counter()
        f = block.form
        n, inductor = len(f.scalar_dtypes), o.backend == "inductor"
        gm = build_graph(f.canon, f.ops, f.out_paths, inductor, n, device=self.device)
        gm = aliases.unalias(gm, block.aliases)
        scalars = [((), (), dt, self.device) for dt in f.scalar_dtypes]
        examples = [
            torch.zeros(shape, dtype=dtype, device=device)
            if not shape
            else torch.empty_strided(shape, stride, dtype=dtype, device=device)
            for shape, stride, dtype, device in aliases.metas(
                list(f.canon.input_meta), block.aliases, scalars
            )
        ]
        if self.sharding is not None:
            examples = self.sharding.prepare(gm, examples, block.placements, block.aliases)
        lowering = time.perf_counter() - t0
        with _DYNAMO, explain.measured() as m:
            fn, seconds = compile_block(gm, examples, o.backend, o.mode, o.dynamic)
        phases = {"lowering": round(lowering, 4), **m["phases"]}
        return fn, seconds, {"code": explain.code_of(gm, fn), "phases": phases, "cache": m["cache"]}


def _placements(placements) -> dict:
    """How many of a block's inputs have each placement: {"Shard(dim=0)": 2, ...} (a plain
    tensor is whole on every rank: "Replicate()")."""
    out: dict = {}
    for p in placements:
        name = "Replicate()" if p is None else ", ".join(repr(x) for x in p)
        out[name] = out.get(name, 0) + 1
    return out


def _no_grad(fn):
    def run():
        with torch.no_grad():
            fn()

    return run


def _alone(ok: bool) -> bool:
    return ok
