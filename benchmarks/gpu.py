"""The GPU check: every way of running a training step on the device at hand, in one call.

    python benchmarks/gpu.py [--device cuda|cpu] [--quick] [--models gpt2-small,llama,...]
                             [--ways eager,gt,...] [--steps N] [--budget S] [--json PATH]

Prepared to run in one short call whenever a GPU is lent (under 8 minutes on one GPU, nothing
to install beyond the README's command); on the CPU (``--device cpu --quick``, what CI runs)
it shows the check still works. Without ``--device`` it needs a CUDA device and says so
(exit 2) where there is none.

Models (in this order, until ``--budget`` seconds are spent: the rest are skipped and said
to be): ``gpt2-small``, a GPT-2-small-sized causal LM (12 layers, 768 wide, batch 8,
sequence 256; tiny under ``--quick``), then the ``transformers`` zoo (gt_bench.zoo: tiny
random configs, SGD with momentum, a fixed batch). Ways, each from the same seed, eager and
torch.compile first with no gt worker alive:

  eager        the step as written, on the device
  compile      torch.compile(step) (inductor, default mode)
  compile-ro   torch.compile(step, mode="reduce-overhead") (CUDA graphs on a GPU)
  gt           the step inside gt_core.capture(): recorded, its hot path compiled by gt
  jit          gt_core.jit(step): replayed without its Python

Per way and model, per step in the steady state (the median of chunks of steps, each ending
in a sync): ``wall ms``; ``client ms`` (this process's CPU time); ``worker ms`` (gt's worker
process's CPU time); ``device ms`` (CUDA kernel time from the profiler for eager and
torch.compile; for gt and jit the compiled block's own run, timed by the worker's CUDA
events); ``idle %`` (the share of the wall time the device did not run that work); and
``vs eager`` (eager's wall ms / this way's). ``diff`` is the largest difference of the
final loss and parameters from eager's after the same steps (torch.compile's draws
dropout's random numbers otherwise than eager: its diff there is no error; gt's is). For gt and jit the main
block's state is printed: its status, runs compiled and eager, whether CUDA graphs were used
and every reason inductor gave for skipping them, and why jit did not replay where it did not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import time

import psutil
import torch

import gt_core
import gt_core.client.capture
from gt_bench import zoo

WAYS = ("eager", "compile", "compile-ro", "gt", "jit")
CHUNK = 10  # steps per timed chunk (one sync at its end)
SETTLE = 20  # steps before the timed ones (for gt, once its main block runs compiled)
MAX_WARM = 300  # steps gt's way waits at most for its main block to compile
SMALL = dict(n_layer=12, n_embd=768, n_head=12, batch=8, seq=256)  # GPT-2 small's sizes
TINY = dict(n_layer=2, n_embd=32, n_head=4, batch=2, seq=16)  # the same model under --quick


class Model:
    """A training step on ``device``: built fresh from one seed, its state readable."""

    def __init__(self, name: str, quick: bool, device: torch.device):
        if name == "gpt2-small":
            self._small(TINY if quick else SMALL, device)
        else:
            z = zoo.build(name)
            self.model, self.step_fn, self.batch = z.model, z.step, z.batch
            self._to(device)

    def _small(self, size: dict, device: torch.device) -> None:
        import transformers

        torch.manual_seed(0)
        cfg = transformers.GPT2Config(
            n_layer=size["n_layer"], n_embd=size["n_embd"], n_head=size["n_head"],
            n_positions=size["seq"],
        )  # fmt: skip
        self.model = transformers.GPT2LMHeadModel(cfg).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, cfg.vocab_size, (size["batch"], size["seq"]), generator=g)
        self.batch = (ids, ids)

        def step(x, labels):
            loss = self.model(input_ids=x, labels=labels).loss
            loss.backward()
            self.opt.step()
            self.opt.zero_grad()
            return loss

        self.step_fn = step
        self._to(device)

    def _to(self, device: torch.device) -> None:
        if gt_core.client.capture.current_session() is not None:  # (the batch drawn on the
            self.batch = tuple(gt_core.to_worker(t) for t in self.batch)  # CPU: to the worker
        elif device.type != "cpu":  # once, as a user keeps a fixed batch on the GPU)
            self.model.to(device)
            self.batch = tuple(t.to(device) for t in self.batch)

    def step(self):
        return self.step_fn(*self.batch)

    def state(self) -> list[torch.Tensor]:
        return [p.detach().cpu() for p in self.model.parameters()]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _worker_cpu_s() -> float:
    """CPU seconds of gt's worker process so far (0 where none runs)."""
    try:
        t = psutil.Process(gt_core.worker().pid).cpu_times()
    except Exception:
        return 0.0
    return t.user + t.system


def timed(step, device, chunks: int, gt_alive: bool) -> dict:
    """Per-step figures over ``chunks`` chunks of CHUNK steps (module docstring)."""
    walls, clients, workers = [], [], []
    loss = None
    for _ in range(chunks):
        w0 = _worker_cpu_s() if gt_alive else 0.0
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(CHUNK):
            loss = step()
        loss.item()
        _sync(device)
        walls.append((time.perf_counter() - t0) * 1e3 / CHUNK)
        clients.append((time.process_time() - c0) * 1e3 / CHUNK)
        workers.append(((_worker_cpu_s() - w0) * 1e3 / CHUNK) if gt_alive else None)
    return {
        "wall_ms": statistics.median(walls),
        "client_ms": statistics.median(clients),
        "worker_ms": statistics.median(workers) if gt_alive else None,
        "loss": loss.item(),
    }


def kernel_ms(step, device) -> float | None:
    """CUDA kernel milliseconds per step (the profiler over one chunk), None off a GPU."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    _sync(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CHUNK):
            step()
        _sync(device)
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / 1e3 / CHUNK


def run_way(way: str, name: str, args, device: torch.device) -> dict:
    warm, chunks = (5, 2) if args.quick else (SETTLE, max(1, args.steps // CHUNK))
    if way in ("gt", "jit"):
        return _through_gt(way, name, args, warm, chunks)
    m = Model(name, args.quick, device)
    step = m.step
    if way != "eager":
        mode = "reduce-overhead" if way == "compile-ro" else None
        # (a mode is inductor's: another backend compiles both ways alike)
        step = torch.compile(m.step, mode=mode if args.backend == "inductor" else None,
                             backend=args.backend)  # fmt: skip
    for _ in range(warm):
        step().item()
    r = timed(step, device, chunks, gt_alive=False)
    r["state"], r["steps"] = m.state(), warm + chunks * CHUNK
    r["device_ms"] = kernel_ms(step, device)  # (after the state: it runs more steps)
    return r


def _through_gt(way: str, name: str, args, warm: int, chunks: int) -> dict:
    try:
        return _gt_way(way, name, args, warm, chunks)
    finally:
        gt_core.worker().stop()  # (no gt process alive while the next model's eager runs)


def _gt_way(way: str, name: str, args, warm: int, chunks: int) -> dict:
    gt_core.reset()
    opts = dict(background=False) if args.quick else {}
    with gt_core.capture(backend=args.backend, **opts):
        m = Model(name, args.quick, torch.device("cpu"))
        step = m.step
        if way == "jit":  # (the batch as its arguments, as a training loop passes it)
            f = gt_core.jit(m.step_fn)
            step = lambda: f(*m.batch)  # noqa: E731
        steps = 0
        while steps < MAX_WARM and (steps < 3 or not _settled(way)):
            step().item()  # (until the main block runs compiled and is judged: no compile
            steps += 1  # in the timed steps)
            if steps % 10 == 0:
                gt_core.wait(compiles=True, timeout=600)
        for _ in range(warm):  # (its first compiled runs: the check, the judge's probes)
            step().item()
        r = timed(step, torch.device("cpu"), chunks, gt_alive=True)
        r["state"], r["steps"] = m.state(), steps + warm + chunks * CHUNK
        r["block"] = _main_block(way)
        on_gpu = str(gt_core.worker().device).startswith("cuda")
        r["device_ms"] = r["block"]["compiled_ms"] if on_gpu else None
    return r


def _settled(way: str) -> bool:
    """Whether the step's main block has stopped changing: compiled and judged, or final."""
    b = _main_block(way)
    return b["status"] in ("failed", "reverted") or (b["status"] == "compiled" and b["judged"])


def _main_block(way: str) -> dict:
    """What the report says of the step's main block (the one that ran most)."""
    paths = gt_core.report().to_data()["hot_paths"]
    if way == "jit":
        paths = [p for p in paths if p.get("jit")] or paths
    if not paths:
        return {"status": "not detected", "compiled_ms": None}
    p = max(paths, key=lambda p: p["compiled_runs"] + p["eager_runs"] + p.get("replayed_runs", 0))
    return {
        "status": getattr(p["status"], "value", p["status"]),
        "judged": p["judged"],
        "n_ops": p["n_ops"],
        "compiled_runs": p["compiled_runs"],
        "eager_runs": p["eager_runs"],
        "replayed_runs": p.get("replayed_runs"),
        "replay_refused": p.get("replay_refused"),
        "compile_s": p["compile_seconds"],
        "compiled_ms": p["compiled_median_ms"],
        "cudagraphs": p["cudagraphs"] or "not asked for",
        "cudagraph_skips": list(p["cudagraph_skips"]),
        "notes": list(p["notes"])[:3],
        "fallback": p["fallback_reason"],
    }


def eager_after(name: str, steps: int, args, device: torch.device) -> dict:
    """Eager's last loss and state after ``steps`` steps from the seed (the oracle)."""
    m = Model(name, args.quick, device)
    for _ in range(steps):
        loss = m.step()
    return {"loss": loss.item(), "state": m.state(), "steps": steps}


def _diff(a: dict, oracle: dict) -> float:
    """The largest difference of ``a``'s last loss and parameters from eager's."""
    worst = abs(a["loss"] - oracle["loss"])
    for x, y in zip(a["state"], oracle["state"], strict=True):
        worst = max(worst, (x.double() - y.double()).abs().max().item())
    return worst


def _fmt(v, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def check(names: list[str], ways: list[str], args, device: torch.device) -> list[dict]:
    rows = []
    print(
        f"{'model':<14} {'way':<11} {'wall ms':>9} {'client ms':>10} {'worker ms':>10} "
        f"{'device ms':>10} {'idle %':>7} {'vs eager':>9} {'diff':>9}"
    )
    t0 = time.perf_counter()
    for name in names:
        if time.perf_counter() - t0 > args.budget:
            print(f"{name:<14} skipped: the check's {args.budget} s were spent (--budget)")
            rows.append({"model": name, "skipped": "budget"})
            continue
        results: dict[str, dict] = {}
        for way in ways:
            try:
                results[way] = run_way(way, name, args, device)
            except Exception as exc:  # (torch.compile of a step it cannot run, say)
                results[way] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        eager = results.get("eager")
        for way, r in results.items():
            row = {"model": name, "way": way, **{k: v for k, v in r.items() if k != "state"}}
            if "error" in r:
                print(f"{name:<14} {way:<11} failed: {r['error']}")
                rows.append(row)
                continue
            dev = r["device_ms"]
            row["idle_pct"] = None if dev is None else max(0.0, 100 * (1 - dev / r["wall_ms"]))
            ok = eager is not None and "error" not in eager
            row["vs_eager"] = eager["wall_ms"] / r["wall_ms"] if ok else None
            oracle = eager if ok and eager["steps"] == r["steps"] else None
            if oracle is None:
                oracle = eager_after(name, r["steps"], args, device)
            row["diff"] = _diff(r, oracle)
            print(
                f"{name:<14} {way:<11} {r['wall_ms']:>9.3f} {r['client_ms']:>10.3f} "
                f"{_fmt(r['worker_ms']):>10} {_fmt(dev):>10} {_fmt(row['idle_pct'], '.0f'):>7} "
                f"{_fmt(row['vs_eager'], '.2f'):>8}x {_fmt(row['diff'], '.1e'):>9}"
            )
            if "block" in r:
                b = r["block"]
                skips = "; ".join(b["cudagraph_skips"]) or "none"
                print(
                    f"{'':<14}   block: {b['status']}, {b.get('n_ops')} ops, "
                    f"{b.get('compiled_runs')} compiled / {b.get('eager_runs')} eager / "
                    f"{b.get('replayed_runs')} replayed runs, compile {_fmt(b.get('compile_s'), '.1f')} s; "
                    f"CUDA graphs {b['cudagraphs']} (skips: {skips})"
                )
                for why in [b.get("replay_refused"), b.get("fallback"), *b.get("notes", [])]:
                    if why:
                        print(f"{'':<14}   {why}")
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes and few steps (CI)")
    ap.add_argument("--models", default=None, help="comma-separated (default: zoo + gpt2-small)")
    ap.add_argument("--ways", default=",".join(WAYS))
    ap.add_argument("--steps", type=int, default=100, help="timed steps per way")
    ap.add_argument(
        "--backend", default="inductor",
        help="torch.compile's and gt's (aot_eager: the plumbing without inductor's compiles)",
    )  # fmt: skip
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--budget", type=float, default=420.0,
        help="seconds after which the models left are skipped (a device lease is short)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.device is None:
        if not torch.cuda.is_available():
            print("benchmarks/gpu.py needs a CUDA device; none here (--device cpu runs it here)")
            return 2
        args.device = "cuda"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("benchmarks/gpu.py --device cuda: no CUDA device here")
        return 2
    default = ["gpt2-small"] if args.quick else ["gpt2-small", *zoo.names()]  # (the realistic
    # size first: a spent budget skips zoo models)
    names = args.models.split(",") if args.models else default
    ways = args.ways.split(",")
    where = torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu"
    print(
        f"gt GPU check {dt.date.today()}, {where}, torch {torch.__version__}, "
        f"{'quick' if args.quick else 'full'}, backend {args.backend}; steady state, medians of "
        f"{CHUNK}-step chunks; "
        "vs eager: eager wall ms / this way's (>1: faster)"
    )
    t0 = time.perf_counter()
    rows = check(names, ways, args, device)
    print(f"done in {time.perf_counter() - t0:.0f} s")
    if args.json:
        doc = {"date": str(dt.date.today()), "device": where, "torch": torch.__version__,
               "quick": args.quick, "backend": args.backend, "rows": rows}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    failed = [r for r in rows if "error" in r and r.get("way") in ("eager", "gt", "jit")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
