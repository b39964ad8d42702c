"""The compilation benchmark: five workloads, eager vs gt (auto-compile) vs jit vs torch.compile.

    python -m gt_bench.bench [--quick] [--iters N] [--backend NAME] [--json PATH]

Every workload runs eagerly, through gt, through ``gt_core.jit``, and as the hand-written
``torch.compile`` of the same step function (for a training step: forward, loss, backward
and optimizer step, which Dynamo splits at ``loss.backward()`` as it would for a user), side
by side in one run.
Per-iteration times are medians of the steady state (the last third), so ratios are
comparable even on a noisy machine. torch.compile's final loss and parameters, and gt's
final loss, are checked against eager's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict

import torch

import gt_core
from gt_bench.bench_results import RTOL, Result, table
from gt_bench.bench_workloads import MODELS, WORKLOADS
from gt_core.observe import metrics

__all__ = ["WORKLOADS", "RTOL", "run", "Result", "table", "main"]


class _Progress:
    """One progress line on stderr, rewritten in place on a TTY. Elsewhere, one line as each
    phase ends and one per quarter of a phase, where ``min_s`` or more passed since the last."""

    def __init__(self, stream=None, tty: bool | None = None, min_s: float = 1.0):
        self.stream, self.min_s = stream, min_s
        self.tty = bool(stream is not None and stream.isatty()) if tty is None else tty

    def phase(self, workload: str, phase: str, n: int) -> Callable[[int], None] | None:
        """A tick(i) to call after iteration i (1-based) of the n in this phase."""
        if self.stream is None:
            return None
        label, t0 = f"{workload}: {phase}", time.perf_counter()
        last, quarter = t0, 0
        if self.tty:
            self._line(f"{label} 0/{n}")

        def tick(i: int) -> None:
            nonlocal last, quarter
            now = time.perf_counter()
            if self.tty and (now - last >= 0.1 or i == n):
                last = now
                self._line(f"{label} {i}/{n} ({100 * i // n}%), {now - t0:.1f} s")
            elif not self.tty and 4 * i // n > quarter:
                quarter = 4 * i // n
                if i < n and now - last >= self.min_s:  # quiet on short phases
                    last = now
                    self._line(f"{label} {i}/{n} ({100 * i // n}%), {now - t0:.1f} s")

        return tick

    def done(self, msg: str) -> None:
        if self.stream is not None:
            self._line(msg)

    def close(self) -> None:
        """Clear the TTY line, so the table starts on a clean one."""
        if self.stream is not None and self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def _line(self, msg: str) -> None:
        self.stream.write(f"\r\x1b[K  … {msg}" if self.tty else f"  … {msg}\n")
        self.stream.flush()


def _steady(times: list[float]) -> float:
    return metrics.steady(times) * 1e3


def _time_loop(step, iters: int, tick=None) -> tuple[list[float], float]:
    """Seconds per iteration (each ends in a ``.item()`` sync), and the last value."""
    times, value = [], float("nan")
    for i in range(iters):
        t0 = time.perf_counter()
        value = step().item()
        times.append(time.perf_counter() - t0)
        if tick:
            tick(i + 1)  # outside the timed part
    return times, value


@torch.no_grad()
def _rel_diff(got: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    """The largest relative difference (max-norm) over pairs of tensors; nan propagates."""
    diffs = [
        (g - e).abs().max() / e.abs().max().clamp_min(1e-12)
        for g, e in zip(got, expected, strict=True)
    ]
    return torch.stack(diffs).max().item()


def run(
    name: str,
    iters: int,
    backend: str,
    progress: _Progress | None = None,
    device: str = "cpu",
    mode: str | None = None,
) -> Result:
    """Run one workload eagerly, through gt and as torch.compile of its step; its figures.

    Eager and torch.compile run in this process on ``device`` (the worker's kind of device,
    so that each way computes on the same hardware); ``mode`` is the compile mode of all three
    compiled ways (gt's blocks, jit's, torch.compile's)."""
    progress = progress or _Progress()
    make = _on(device, WORKLOADS.get(name) or MODELS[name])
    torch.manual_seed(0)
    step, state = make()
    eager, eager_value = _time_loop(step, iters, progress.phase(name, "eager", iters))
    expected = [torch.tensor(eager_value), *(t.detach().clone() for t in state)]
    e = _steady(eager)
    progress.done(f"{name}: eager {e:.3f} ms/it")

    tick = progress.phase(name, "gt", iters)
    gt_times, gt_value, status, compile_s = _gt_loop(make.plain, iters, backend, mode, tick)
    g = _steady(gt_times)
    gt_diff = _rel_diff([torch.tensor(gt_value)], expected[:1])
    progress.done(f"{name}: gt {g:.3f} ms/it ({status})")

    jit = _jit_ms(make.plain, iters, backend, mode, progress.phase(name, "jit", iters))
    progress.done(f"{name}: jit {jit:.3f} ms/it")

    tick = progress.phase(name, "torch.compile", iters)
    tc, tc_total, tc_diff, tc_error = _baseline(make, iters, backend, mode, tick, expected)
    progress.done(f"{name}: torch.compile " + (tc_error or f"{tc:.3f} ms/it"))

    # Warmup: the gt iterations before its per-iteration time settles near the steady state.
    warm = next((i for i, t in enumerate(gt_times) if t * 1e3 <= 1.5 * g), len(gt_times))
    return Result(
        workload=name,
        iters=iters,
        eager_ms=e,
        gt_ms=g,
        torch_compile_ms=tc,
        speedup=metrics.speedup(e, g),
        torch_compile_speedup=None if tc is None else metrics.speedup(e, tc),
        eager_total_s=sum(eager),
        gt_total_s=sum(gt_times),
        torch_compile_total_s=tc_total,
        gt_warmup_s=sum(gt_times[:warm]),
        gt_compile_s=compile_s,
        break_even=_break_even(gt_times, e),
        gt_rel_diff=gt_diff,
        torch_compile_rel_diff=tc_diff,
        status=status,
        verdict=_verdict(metrics.speedup(e, g), status),
        jit_ms=jit,
        jit_speedup=metrics.speedup(e, jit),
        torch_compile_error=tc_error,
    )


def _verdict(speedup: float, status: str) -> str:
    """gt against eager in a word, and the hot path's state where it is not compiled."""
    word = "faster" if speedup >= 1.1 else "on par" if speedup >= 0.9 else "slower"
    return word + ("" if status == "compiled" else f" ({status})")


def _gt_loop(make, iters: int, backend: str, mode: str | None, tick) -> tuple:
    """The workload's loop through gt: its times, last value, top hot path's status and
    compile seconds."""
    gt_core.reset()
    with gt_core.capture(backend=backend, mode=mode, auto_compile=True, background=True):
        torch.manual_seed(0)
        step, _ = make()
        times, value = _time_loop(step, iters, tick)
        # A compile still running (the loop was shorter than it) would slow the next
        # workloads' timings on the same worker: let it finish, outside every timed part.
        gt_core.wait(compiles=True, timeout=600)
    paths = sorted(gt_core.report().to_data()["hot_paths"], key=lambda p: -p["compiled_runs"])
    top = paths[0] if paths else None
    status = top["status"] if top else "no hot path"
    return times, value, status, top["compile_seconds"] if top else None


def _baseline(make, iters: int, backend: str, mode: str | None, tick, expected) -> tuple:
    """torch.compile's (ms, total s, difference from eager, None), or (None, None, None, why
    it failed): the baseline failing is a figure of its own, not the end of the run."""
    try:
        times, value, state = _torch_compile_loop(make, iters, backend, mode, tick)
    except Exception as exc:
        torch._dynamo.reset()
        first = str(exc).splitlines()[0] if str(exc) else ""
        return None, None, None, f"failed: {type(exc).__name__}: {first}"
    diff = _rel_diff([torch.tensor(value), *state], expected)
    return _steady(times), sum(times), diff, None


def _torch_compile_loop(make, iters: int, backend: str, mode: str | None, tick) -> tuple:
    """The hand-written baseline: torch.compile of the whole step function, same seed and
    data; its times, last value and state."""
    torch.manual_seed(0)
    step, state = make()
    compiled = _wrapped(step, lambda fn: _steps(torch.compile(fn, backend=backend, mode=mode)))
    times, value = _time_loop(compiled, iters, tick)
    torch._dynamo.reset()
    return times, value, state


def _steps(compiled):
    """``compiled`` called as a training loop calls it: under CUDA graphs (reduce-overhead),
    each call begins a new step, as torch tells users to mark, so the last call's outputs
    (the optimizer reads the gradients it left) are not taken for live graph outputs."""

    def call(*args):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return call


def _on(device: str, make):
    """``make`` building its model and data on ``device`` (its ``plain`` form: as written, for
    gt, whose worker places everything on its own device)."""

    def made():
        with torch.device(device):
            return make()

    made.plain = make
    return made


_SETTLE = 30  # calls after the compile: its check, the regression check's eager probes and
# the worker's thread-count trials run there, once, not in the timed calls
_CHUNK = 10  # timed calls per sync: the median chunk is the steady state


def _jit_ms(make, iters: int, backend: str, mode: str | None = None, tick=None) -> float:
    """ms per call of the step through ``gt_core.jit`` in the steady state: warm-up calls,
    the block compiled and settled (see _SETTLE), then ``iters`` timed calls in chunks of
    ``_CHUNK`` each ending in a sync (replayed calls do not wait for the worker: a call's
    own time is not its time); the median chunk, per call, as _steady takes the others'."""
    gt_core.reset()
    with gt_core.capture(backend=backend, mode=mode, auto_compile=True, background=True):
        torch.manual_seed(0)
        step, _ = make()
        f = _wrapped(step, gt_core.jit)
        for _ in range(20):
            f()
        gt_core.wait(compiles=True, timeout=600)  # the block compiled, as in a long run
        for _ in range(_SETTLE):
            f()
        f().item()
        chunks = []
        for c in range(max(1, iters // _CHUNK)):
            t0 = time.perf_counter()
            for _ in range(_CHUNK):
                out = f()
            out.item()
            chunks.append((time.perf_counter() - t0) / _CHUNK * 1e3)
            if tick:
                tick((c + 1) * _CHUNK)
        return statistics.median(chunks)


def _wrapped(step, wrap):
    """``wrap(step)``; for a step fed by a DataLoader, each call gives the next batch to the
    wrapped training step (the batch is its argument: the data flows, the step replays)."""
    if not hasattr(step, "fed"):
        return wrap(step)
    train, batches = step.fed
    wrapped = wrap(train)
    return lambda: wrapped(*next(batches))


def _break_even(gt_times: list[float], eager_ms: float) -> int | None:
    """The first iteration where gt's total, compiles included, is below eager's."""
    n = len(gt_times)  # each iteration against the eager median; no compile charged apart
    ms = [t * 1e3 for t in gt_times]
    return metrics.break_even(["compiled"] * n, ms, None, n, baseline=eager_ms)["break_even"]


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m gt_bench.bench", description=__doc__.splitlines()[0]
    )
    ap.add_argument(
        "--quick", action="store_true", help="few iterations, aot_eager: a smoke run in seconds"
    )
    ap.add_argument(
        "--iters", type=int, default=None, help="iterations per workload (default 200, quick 30)"
    )
    ap.add_argument(
        "--backend", default=None, help="torch.compile backend (default inductor, quick aot_eager)"
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument(
        "--models",
        action="store_true",
        help="the transformers models of gt_bench.zoo (BERT, Llama, GPT-2, T5, ViT, ResNet)",
    )
    ap.add_argument(
        "--only", metavar="NAME", action="append", help="run only this workload (repeatable)"
    )
    ap.add_argument(
        "--mode", default=None, help="compile mode of every compiled way (e.g. reduce-overhead)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="intra-op threads of this process and of the worker, fixed (on a shared CPU, two "
        "threads' barriers stall when the other processes hold a core: every column then "
        "measures the stalls)",
    )
    return ap


def main(argv=None) -> list[Result]:
    ap = _parser()
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
        gt_core.configure(worker_threads=args.threads)
    iters = args.iters or (30 if args.quick else 200)
    backend = args.backend or ("aot_eager" if args.quick else "inductor")
    known = MODELS if args.models else WORKLOADS
    names = args.only or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        ap.error(f"unknown workload {unknown[0]!r}; expected one of {', '.join(known)}")

    device = torch.device(
        gt_core.worker().device
    ).type  # eager and torch.compile run on the same kind
    print(
        f"gt benchmark: {iters} iterations, backend {backend}, mode {args.mode or 'default'}, "
        f"torch {torch.__version__}, device {device}, {time.strftime('%Y-%m-%d')}",
        flush=True,
    )
    progress = _Progress(sys.stderr)
    try:
        results = [run(n, iters, backend, progress, device, args.mode) for n in names]
    finally:
        progress.close()
    print(table(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "backend": backend,
                    "iters": iters,
                    "rtol": RTOL,
                    "results": [asdict(r) for r in results],
                },
                f,
                indent=1,
            )
    return results


if __name__ == "__main__":
    main()
    gt_core.worker().stop()
