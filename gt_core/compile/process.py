"""Inductor compiles in a process of their own, so a compile cannot stall the worker.

Compiling with inductor is seconds of Python (tracing, lowering, code generation) plus C++
builds. In a thread of the worker it shares the worker's GIL and garbage collector, and a
block running eagerly beside it stalls at each full collection of the objects inductor has
just created (benchmarks/stall.py measures it). So the worker hands the block's FX graph to a compile process (started once, at low
priority, kept for later blocks) that runs ``torch._inductor.standalone_compile`` and saves
the artifact; the worker only loads it (~15 ms once inductor's loading path is imported).

At a worker's start, :meth:`CompileProcess.imports` imports that path (before it serves, the
collector paused) and :meth:`CompileProcess.warm` compiles and loads a one-op graph, so the
first load's setup does not land beside a block's eager runs.

Killing the process mid-compile (its group, with its C++ builds) can leave a kernel half
linked in inductor's cache; the next compile of it, in any process, evicts it and compiles
again (see repair), and the files evicted come back with the reply.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from multiprocessing.connection import Connection

from gt_core.compile import block_cache, explain, repair
from gt_core.stream.instructions import qualified_name
from gt_core.stream.meta import ValueMeta, value_meta

__all__ = ["CompileProcess", "CompileProcessDied", "CompileCancelled", "end_group"]

_NICE = 19  # the compile process yields the CPU to the client and the worker
_WANTED_EVERY_S = 0.2  # how often a compile under way asks whether it is still wanted


class CompileProcessDied(RuntimeError):
    """The compile process exited while compiling a block (it is restarted for the next one)."""


class CompileCancelled(RuntimeError):
    """The compile was no longer wanted (``wanted()`` turned false): not started, or the
    compile process was stopped under it (it is restarted for the next one)."""


class CompileProcess:
    """The worker's side: a block (or a graph) in, a loaded compiled callable out; thread-safe."""

    def __init__(self, imports: tuple = (), on_start=None) -> None:
        self._imports = tuple(imports)  # the worker_imports option: their ops appear in blocks
        self._on_start = on_start  # called with (pid, folder) each time a process starts
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._lock = threading.Lock()  # one compile at a time; callers wait without the GIL
        self._dir: str | None = None  # made with the process, removed with it (see main)
        self._ids = itertools.count()
        self._warm = threading.Lock()
        self._warmed = False
        self._closed = False

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @staticmethod
    def imports() -> None:
        """Inductor's loading path imported, its source hash computed (~2.5 s of Python) and
        the CPU's vector ISA probed (a load's first kernel asks for it), the collector
        paused: for the worker's start, before it serves anything. Left to the first load,
        these ran beside the user's first steps (docs/benchmarks.md)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            import torch._inductor.codecache as codecache
            import torch._inductor.compile_fx  # noqa: F401
            import torch._inductor.standalone_compile  # noqa: F401

            codecache.torch_key()  # hashes torch's sources once per process (cached)
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            pick_vec_isa()  # a load's compiler probes (~1 s of subprocesses), once per process
        finally:
            gc.freeze()
            if collecting:
                gc.enable()

    def start(self) -> None:
        """Start the process (it imports torch and inductor: seconds) if it is not running."""
        with self._lock:
            self._ensure_running()

    def warm(self) -> None:
        """Start the process, compile and load a one-op graph (once): the first load's setup
        happens here (at the worker's start), not beside a block's eager runs."""
        with self._warm:
            if self._warmed:
                return
            import torch
            import torch.fx as fx
            from torch._inductor.cpu_vec_isa import pick_vec_isa

            self.start()  # it imports meanwhile
            pick_vec_isa()  # ~1 s of compiler probes (subprocesses: the GIL stays free)

            g = fx.Graph()
            x = g.placeholder("x")
            g.output((g.call_function(torch.ops.aten.add.Tensor, (x, 1)),))
            self.compile_graph(fx.GraphModule(torch.nn.Module(), g), [torch.zeros(2)], None)
            self._warmed = True

    def compile_graph(self, gm, examples: list, mode: str | None):
        """Compile an FX graph for ``examples``' metadata: (callable, seconds)."""
        metas = [value_meta(t) for t in examples]
        return self._compile(("graph", pickle.dumps(gm)), metas, mode)[:2]

    def compile_block(
        self, canon, ops: dict, out_paths, scalar_dtypes, device, mode, shared=None, wanted=None
    ):
        """Compile a hot block (as ``build_graph`` takes it, for inductor, its inputs sharing
        memory as ``shared`` says: see aliases): (callable, seconds, info), info its code,
        phases and cache use (see explain).

        The graph is built in the compile process, so not even that Python runs here.
        ``wanted()``, asked before the compile starts and every _WANTED_EVERY_S while it runs:
        once false, the compile is dropped (the process stopped under it) and
        CompileCancelled raised.
        """
        from gt_core.compile import aliases

        names = {name: qualified_name(op) for name, op in ops.items()}
        scalars = [ValueMeta((), (), dt, device) for dt in scalar_dtypes]
        metas = aliases.metas(list(canon.input_meta), shared, scalars)
        job = ("block", canon, names, out_paths, len(scalar_dtypes), shared, device)
        return self._compile(job, metas, mode, wanted=wanted)

    def _compile(self, job: tuple, metas: list, mode: str | None, look=True, wanted=None):
        from torch._inductor import list_mode_options

        options = list_mode_options(mode) if mode not in (None, "default") else {}
        k = block_cache.key(job, metas, options)
        with self._lock:
            t0 = time.perf_counter()
            path = os.path.join(self._folder(), f"{next(self._ids)}.bin")
            info = block_cache.lookup(k, path) if look else None
            hit = info is not None
            if hit:  # (the phases of the compile that made it, kept with it: what it saved)
                info.update(cache=block_cache.KEPT, phases={}, kept_phases=info.get("phases") or {})
            else:
                info = self._compile_there(job, metas, options, path, wanted)
                block_cache.keep(k, path, info)
        t1 = time.perf_counter()
        try:
            fn = _load(path)  # (the next job compiles meanwhile)
        except Exception:
            if not hit:
                raise
            block_cache.forget(k)  # (a kept artifact this torch cannot load: compiled anew)
            return self._compile(job, metas, mode, look=False, wanted=wanted)
        info["phases"]["load"] = round(time.perf_counter() - t1, 4)
        return fn, time.perf_counter() - t0, info

    def _compile_there(self, job: tuple, metas: list, options: dict, path: str, wanted) -> dict:
        """The compile process compiles ``job`` to ``path``: its info (code, phases, cache)."""
        if wanted is not None and not wanted():
            raise CompileCancelled("no longer wanted: not started")
        self._ensure_running()
        try:
            self._conn.send((job, metas, options, path))
            while not self._conn.poll(_WANTED_EVERY_S):
                if wanted is not None and not wanted():
                    self._stop()  # (with the C++ builds it started)
                    raise CompileCancelled("no longer wanted: stopped while it compiled")
            status, reason, evicted, info = self._conn.recv()
        except (EOFError, OSError) as exc:
            code = self._stop()
            raise CompileProcessDied(
                f"gt's compile process (inductor) exited while compiling this block "
                f"(exit code {code}; {type(exc).__name__}). It is started again for the next "
                "block; this one runs eagerly."
            ) from None
        repair.record(evicted)  # for this thread's compile event (see repair.evictions)
        if status != "ok":
            raise RuntimeError(reason)
        return info

    def close(self) -> None:
        """Stop the process now, for good; a compile waiting on it ends with CompileProcessDied.

        (A warm-up under way must not start it again: that process outlived the worker, its
        imports taking a core for seconds after the worker stopped.)
        """
        self._closed = True
        self._stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)

    def _folder(self) -> str:
        """Where artifacts go (made once; removed with the process or by close)."""
        if self._closed:
            raise RuntimeError(
                "gt's compile process was closed (the worker stops or no longer needs it)"
            )
        if self._dir is None or not os.path.isdir(self._dir):
            self._dir = tempfile.mkdtemp(prefix="gt-compile-")
        return self._dir

    def _ensure_running(self) -> None:
        """Start the process unless it runs (the caller holds the lock)."""
        self._folder()
        if self._proc is not None and self._proc.poll() is None:
            return
        ours, theirs = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        code = (
            "from gt_core.compile.process import main; "
            f"main({theirs.fileno()}, {self._dir!r}, {self._imports!r}, {sys.path!r})"
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-c", code],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group: its C++ builds end with it
        )
        theirs.close()
        self._conn = Connection(ours.detach())
        if self._on_start is not None:
            self._on_start(self._proc.pid, self._dir)

    def _stop(self) -> int | None:
        """Kill the process (its work is in inductor's cache or lost); a compile waiting on it
        reads EOF. Returns its exit code."""
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        code = None
        if proc is not None:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # with the C++ builds it started
                except OSError:
                    proc.kill()
            code = proc.wait()
        if conn is not None:
            conn.close()
        return code


def end_group(pid: int, folder: str | None) -> None:
    """End a compile process and its C++ builds (its process group) and remove its folder."""
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def _load(path: str):
    """The compiled artifact at ``path`` as a callable; the collector is paused meanwhile."""
    from torch._inductor.standalone_compile import CompiledArtifact

    collecting = gc.isenabled()
    gc.disable()
    try:
        return repair.retrying(lambda: CompiledArtifact.load(path=path, format="binary"))
    finally:
        if collecting:
            gc.enable()
        os.remove(path)


def _build(canon, names, out_paths, n_scalars, shared, device):
    from gt_core.compile import aliases
    from gt_core.compile.lower import build_graph
    from gt_core.stream.instructions import resolve_op

    ops = {name: resolve_op(q) for name, q in names.items()}
    gm = build_graph(canon, ops, out_paths, True, n_scalars, device=device)  # (alpha rewritten)
    return aliases.unalias(gm, shared)


def _end_with(parent: int, folder: str) -> None:
    """Once ``parent`` (the worker) is gone, however it went: remove ``folder`` and end this
    process group (this process and the C++ builds it started), mid-compile or not.

    (At idle priority on busy cores this thread may wait long for the GIL: the client ends
    the group too once it finds the worker dead, see ProcessTransport.death.)"""
    while os.getppid() == parent:
        time.sleep(0.5)
    shutil.rmtree(folder, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)


def _idle_priority() -> None:
    """Imported at normal priority (the worker is starting too, nothing runs yet); from here
    on the process runs only on a core nothing else wants, and its C++ builds inherit that."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        try:
            os.nice(_NICE)
        except OSError:
            pass


def _compile_job(job: tuple, metas: list, options: dict, info: dict):
    """One job's compiled artifact; ``info`` gets its code, phases and cache use."""
    import torch
    from torch._inductor import standalone_compile

    from gt_core.compile.rng_layout import pin_random_layouts

    t0 = time.perf_counter()
    gm = pickle.loads(job[1]) if job[0] == "graph" else _build(*job[1:])
    lowering = time.perf_counter() - t0
    examples = [
        torch.empty_strided(shape, stride, dtype=dtype, device=device)
        for shape, stride, dtype, device in metas
    ]
    pin_random_layouts(gm, examples)  # (as compile_block does: compile.rng_layout)
    # (standalone_compile hands ``options`` to compile_fx as its arguments: the mode's
    # config goes in as its config patches)
    with torch.enable_grad(), explain.measured() as m:  # (see compile_block)
        art = standalone_compile(
            gm,
            examples,
            dynamic_shapes="from_example_inputs",
            options={"config_patches": options} if options else {},
        )
    info.update(code=explain.code_of(gm, art), cache=m["cache"])
    info["phases"] = {"lowering": round(lowering, 4), **m["phases"]}
    return art


def main(fd: int, folder: str, imports: tuple = (), path: list = ()) -> None:
    """The compile process: compile jobs from ``fd`` until the worker closes it.

    ``folder``: where its artifacts go (removed with it); ``imports``: the worker_imports
    modules, found on the worker's ``path`` (appended).
    """
    conn = Connection(fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal is the client's
    threading.Thread(
        target=_end_with, args=(os.getppid(), folder), name="gt-end-with-worker", daemon=True
    ).start()
    import torch  # noqa: F401 (imported now, before the first job)

    from gt_core.stream.instructions import import_op_modules

    sys.path.extend(p for p in path if p not in sys.path)
    unknown = ""  # why ops of worker_imports may be missing here: said with each failure
    try:
        import_op_modules(imports)
    except Exception as exc:
        unknown = f" ({exc})"
    import torch._inductor.config as ic
    from torch._inductor import standalone_compile  # noqa: F401 (imported before the first job)
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    ic.fallback_random = True  # as in the worker: compiled random ops draw like eager ones
    pick_vec_isa()  # its compiler probes, once per process
    _idle_priority()
    while True:
        try:
            job, metas, options, path = conn.recv()
        except (EOFError, OSError):
            return

        info: dict = {}  # what the explorer shows of it (see explain)
        compile_job = functools.partial(_compile_job, job, metas, options, info)
        with repair.evictions() as evicted:  # damaged cache files found, removed, compiled again
            try:
                repair.retrying(compile_job).save(path=path, format="binary")
                reply = ("ok", None, evicted, info)
            except Exception as exc:
                reply = ("err", f"{type(exc).__name__}: {exc}{unknown}", evicted, None)
        try:
            conn.send(reply)
        except OSError:  # the worker went away meanwhile
            return
