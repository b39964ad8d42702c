"""The data path: uploads, fetches, and a training loop fed by a DataLoader (one run, medians).

    python benchmarks/data.py [--quick] [--steps N] [--repeats R] [--batch B] [--backend NAME]
                              [--seeds K]

Transfers, through a worker process:

  size          a host tensor of 4 KB, 200 KB, 4 MB and 64 MB
  sync ms       a one-element ``index_select`` of a worker tensor of that size and its
                ``.item()``: a sync alone (timed alternately with the uploads of that size)
  +upload ms    the same on a fresh host tensor (uploaded on the way) minus the sync alone
  up GB/s       size / +upload ms (the client's copy into the ring and the worker's out of it)
  .cpu() ms     fetching a worker tensor of that size (a sync and the copies)
  down GB/s     size / .cpu() ms

Then the loop of ``gt_bench.workloads.fed``: MLP 784→256→10, cross-entropy, SGD momentum, a
shuffled DataLoader batch every step from host data, run five ways from the same seed on the
same batches: eager; plain gt (the loop inside a capture); gt resident (the same, its data
copied in the capture first, so that it lives on the worker and each batch is made there, as
with data a notebook makes in a ``%%gt`` cell); ``gt_core.jit`` of the step (the
batch is its argument); ``torch.compile`` of the step (eager, in this process). ms per step
(the median over the repeats of steady-state steps, one sync at the end), the ratio to eager,
and the largest difference of a parameter from eager's after the same steps (beside it, that
of eager itself with its threads alternating: rounding alone, see rounding_reference), and the
CPU time per step of this process and of the worker (both over the timed steps: where a way
spends two cores' time, or one waits for the other). Variants
alternate within each repeat, so ratios compare runs made side by side; timings on a shared
2-core CPU vary ±30% between runs. Then the loop over a dataset of one's own (numpy rows,
see own_dataset). Last, the parameters' difference from eager per seed of
the loop (``--seeds``, see by_seed): plain gt with its blocks run eagerly must be exact.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time

import psutil
import torch

import gt_core
from gt_bench.workloads import fed

SIZES = {"4 KB": 4 << 10, "200 KB": 200 << 10, "4 MB": 4 << 20, "64 MB": 64 << 20}
VARIANTS = ("eager", "gt", "gt resident", "jit", "torch.compile")
ON_WORKER = ("gt", "gt resident", "jit")


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def transfers(repeats: int) -> list[tuple]:
    """(size, sync ms, +upload ms, up GB/s, .cpu() ms, down GB/s) per size."""
    hosts = {name: [torch.ones(nbytes // 4) for _ in range(2)] for name, nbytes in SIZES.items()}
    with gt_core.capture(auto_compile=False):
        idx = torch.zeros(1, dtype=torch.long)  # a worker tensor: the op runs there
        idx.item()
        # host tensors, made outside the capture: each is uploaded
        return [_transfer(name, hosts.pop(name), idx, repeats) for name in SIZES]


def _transfer(name: str, host: list, idx, repeats: int) -> tuple:
    nbytes = SIZES[name]
    resident = torch.zeros(nbytes // 4)  # a worker tensor of the same size
    # (small sizes take well under a millisecond a sample: many, for a steady median)
    times = max(5, repeats * 3) if nbytes >= 1 << 20 else 200
    torch.index_select(resident, 0, idx).item()
    sync, up = [], []
    for k in range(-3, times):  # (three first: a size's first uploads find no storage to reuse)
        # The sync alone and the sync with an upload alternate: both medians come from the
        # same stretch of time, whatever the machine does meanwhile.
        alone = _median_ms(lambda: torch.index_select(resident, 0, idx).item(), 1)
        fresh = host[k % 2]
        fresh.add_(0)  # a new version: the upload cache does not hold it
        ms = _median_ms(lambda t=fresh: torch.index_select(t, 0, idx).item(), 1)
        if k >= 0:
            sync.append(alone)
            up.append(ms)
    sync_ms = statistics.median(sync)
    up_ms = max(statistics.median(up) - sync_ms, 1e-3)
    resident.cpu()
    down_ms = _median_ms(resident.cpu, times)
    return name, sync_ms, up_ms, nbytes / up_ms / 1e6, down_ms, nbytes / down_ms / 1e6


def _cpu_ms(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    t = proc.cpu_times()
    return (t.user + t.system) * 1e3


def loop(
    variant: str,
    batch: int,
    steps: int,
    backend: str,
    mode: str | None = None,
    seed: int = 0,
    compile: bool = True,
    rows: bool = False,
) -> tuple[float, list, dict, tuple[float, float]]:
    """(ms per step, the parameters after training, the report's data figures, CPU ms per
    step of this process and of the worker) of one way of running the DataLoader loop:
    warm-up steps, then ``steps`` timed ones. Eager and
    torch.compile run on the worker's kind of device (on a GPU: the loader pins each batch
    and the step moves it there); gt's loop is the same code without a device."""
    on_worker = variant in ON_WORKER
    opts = dict(backend=backend, mode=mode, auto_compile=compile)
    ctx = gt_core.capture(**opts) if on_worker else None
    if on_worker:
        gt_core.reset()
    device = torch.device(gt_core.worker().device).type
    with ctx or contextlib.nullcontext():
        f = fed(
            batch,
            seed=seed,
            device=None if on_worker or device == "cpu" else device,
            resident=variant == "gt resident",
            rows=rows,
        )
        run = f.step
        if variant == "jit":
            run = gt_core.jit(f.step)
        elif variant == "torch.compile":
            run = torch.compile(f.step, backend=backend, mode=mode)
        batches = f.batches()
        for _ in range(30):
            run(*next(batches))
        if on_worker:
            gt_core.wait(compiles=compile, timeout=600)  # compiled, as in a long run
        run(*next(batches)).item()
        me = psutil.Process()
        worker = psutil.Process(gt_core.worker().pid) if on_worker else None
        c0, w0 = _cpu_ms(me), _cpu_ms(worker)
        t0 = time.perf_counter()
        for _ in range(steps):
            loss = run(*next(batches))
        loss.item()
        ms = (time.perf_counter() - t0) / steps * 1e3
        cpu = ((_cpu_ms(me) - c0) / steps, (_cpu_ms(worker) - w0) / steps)
        params = [p.detach().cpu() for p in f.params]
        figures = gt_core.report().to_data().get("data", {}) if on_worker else {}
    if variant == "torch.compile":
        torch._dynamo.reset()
    return ms, params, figures, cpu


def _max_diff(got: list, want: list) -> float:
    """The largest difference of an element of ``got``'s tensors from ``want``'s."""
    return max((g - w).abs().max().item() for g, w in zip(got, want, strict=True))


def rounding_reference(batch: int, steps: int) -> list:
    """The parameters of the eager loop with its intra-op threads alternating 1 and 2 per step.

    What rounding alone does to the comparison with eager: a kernel's sums depend on how its
    work is split over threads (and a compiled graph's on its fused order); a ReLU input near
    zero then flips and the parameters part by ~1e-4 after a few dozen steps, although every
    step is right. The worker runs eager ops on eager's thread count (bit for bit: see
    by_seed); a compiled block's rounding is its compiler's, like torch.compile's.
    """
    was = torch.get_num_threads()
    f = fed(batch)
    batches = f.batches()
    try:
        for i in range(31 + steps):
            torch.set_num_threads(1 + i % 2 if was > 1 else was)
            f.step(*next(batches))
    finally:
        torch.set_num_threads(was)
    return [p.detach().clone() for p in f.params]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few steps, one repeat (a smoke run)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--backend", default=None, help="default inductor (quick: aot_eager)")
    ap.add_argument("--mode", default=None, help="compile mode (e.g. reduce-overhead on a GPU)")
    ap.add_argument("--no-loop", action="store_true", help="the transfers only")
    ap.add_argument(
        "--seeds", type=int, default=3, help="seeds of the parameters-by-seed table (0: none)"
    )
    a = ap.parse_args(argv)
    if a.quick:
        a.steps, a.repeats, a.seeds = 40, 1, 0
    a.backend = a.backend or ("aot_eager" if a.quick else "inductor")
    print(
        f"gt data path: torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"worker device {gt_core.worker().device}, {time.strftime('%Y-%m-%d')}"
    )
    print(
        f"{'size':>7} {'sync ms':>8} {'+upload ms':>11} {'up GB/s':>8} {'.cpu() ms':>10} "
        f"{'down GB/s':>10}"
    )
    for name, sync_ms, up_ms, up_gbs, down_ms, down_gbs in transfers(a.repeats):
        print(
            f"{name:>7} {sync_ms:>8.3f} {up_ms:>11.3f} {up_gbs:>8.2f} {down_ms:>10.3f} "
            f"{down_gbs:>10.2f}"
        )

    if a.no_loop:
        return
    print(
        f"\nDataLoader loop: MLP 784-256-10, cross-entropy, SGD momentum, batch {a.batch}, "
        f"a shuffled batch each step, {a.steps} steps x {a.repeats}, backend {a.backend}"
    )
    loop("eager", a.batch, 20, a.backend)  # (the first loop in a process runs slow)
    ms, params, cpu, figures = _rounds(VARIANTS, a.repeats, a.batch, a.steps, a.backend, a.mode)
    eager = statistics.median(ms["eager"])
    print(
        f"{'way':>14} {'ms/step':>8} {'vs eager':>9} {'max |param - eager|':>20} "
        f"{'cpu ms: here':>13} {'worker':>7}"
    )
    for v in VARIANTS:
        m = statistics.median(ms[v])
        diff = _max_diff(params[v], params["eager"])
        here = statistics.median(c[0] for c in cpu[v])
        worker = statistics.median(c[1] for c in cpu[v]) if v in ON_WORKER else None
        w = f"{worker:>7.3f}" if worker is not None else f"{'-':>7}"
        print(f"{v:>14} {m:>8.3f} {eager / m:>8.2f}x {diff:>20.2e} {here:>13.3f} {w}")
    if torch.device(gt_core.worker().device).type == "cpu":
        ref = rounding_reference(a.batch, a.steps)
        diff = _max_diff(ref, params["eager"])
        print(f"{'eager 1t/2t':>14} {'-':>8} {'-':>9} {diff:>20.2e}")
        print(
            "eager 1t/2t: eager with its threads alternating 1 and 2 per step, the size of "
            "differences from rounding alone"
        )
    if figures:
        print(
            "plain gt, per iteration: {:.1f} KB in, {:.1f} KB out, {:.3f} ms copying".format(
                (figures.get("bytes_up_per_iter") or 0) / 1e3,
                (figures.get("bytes_down_per_iter") or 0) / 1e3,
                figures.get("ms_per_iter") or 0.0,
            )
        )
    own_dataset(a.batch, a.steps, a.repeats, a.backend, a.mode)
    if a.seeds:
        by_seed(a.batch, a.steps, a.backend, a.mode, a.seeds)


def _rounds(ways: tuple, repeats: int, *args, **kwargs) -> tuple[dict, dict, dict, dict]:
    """``repeats`` rounds of ``loop(way, *args, **kwargs)`` for each way in turn: ms per step
    and CPU ms of each round by way, the parameters of each way's last round, and the
    report's data figures of the first way that has them."""
    ms: dict[str, list[float]] = {v: [] for v in ways}
    cpu: dict[str, list[tuple]] = {v: [] for v in ways}
    params: dict[str, list] = {}
    figures: dict = {}
    for _ in range(repeats):
        for v in ways:
            t, params[v], got, c = loop(v, *args, **kwargs)
            ms[v].append(t)
            cpu[v].append(c)
            figures = figures or got
    return ms, params, cpu, figures


OWN = ("eager", "gt", "jit", "torch.compile")


def own_dataset(batch: int, steps: int, repeats: int, backend: str, mode: str | None) -> None:
    """The same loop over a dataset of one's own (workloads.NumpyRows: numpy rows made
    tensors in ``__getitem__``, an int label): the same batches, made row by row, on the host
    as in eager (gt makes a batch's tensors there, and sends it up in one message)."""
    print(
        f"\nA dataset of one's own (numpy rows, torch.from_numpy in __getitem__), "
        f"{steps} steps x {repeats}"
    )
    ms, params, _, _ = _rounds(OWN, repeats, batch, steps, backend, mode, rows=True)
    eager = statistics.median(ms["eager"])
    print(f"{'way':>14} {'ms/step':>8} {'vs eager':>9} {'max |param - eager|':>20}")
    for v in OWN:
        m = statistics.median(ms[v])
        diff = _max_diff(params[v], params["eager"])
        print(f"{v:>14} {m:>8.3f} {eager / m:>8.2f}x {diff:>20.2e}")


BY_SEED = {  # way -> (variant of loop, whether it compiles)
    "gt, not compiling": ("gt", False),
    "gt": ("gt", True),
    "jit": ("jit", True),
    "torch.compile": ("torch.compile", True),
}


def by_seed(batch: int, steps: int, backend: str, mode: str | None, seeds: int) -> None:
    """The largest parameter difference from eager of each way, per seed of the loop (its
    initial weights and its shuffle): which runs part from eager, and how far.

    "gt, not compiling" runs plain gt's hot blocks as their eager graphs (auto_compile off):
    the data path and the worker alone, which must give eager's parameters bit for bit. The compiled
    ways round as their compiler does; a difference of 1e-8 flips a ReLU unit now and then,
    after which the parameters part by 1e-4 to 1e-3 (for torch.compile of the step as well).
    """
    print(f"\nParameters by seed: max |param - eager| after {30 + 1 + steps} steps")
    print(f"{'way':>18} " + " ".join(f"{'seed ' + str(k):>9}" for k in range(seeds)))
    rows: dict[str, list[float]] = {w: [] for w in BY_SEED}
    for seed in range(seeds):
        _, want, _, _ = loop("eager", batch, steps, backend, seed=seed)
        for way, (variant, compiles) in BY_SEED.items():
            if not compiles:  # (a fresh worker: blocks compiled before would run compiled)
                gt_core.worker().restart()
            _, got, _, _ = loop(variant, batch, steps, backend, mode, seed, compiles)
            rows[way].append(_max_diff(got, want))
    for way, diffs in rows.items():
        print(f"{way:>18} " + " ".join(f"{d:>9.1e}" for d in diffs))


if __name__ == "__main__":
    main()
    gt_core.worker().stop()
