"""Every benchmark script's quick version runs (no timing is asserted)."""

import io
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from gt_bench import bench

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (arguments, strings its stdout must hold)
QUICK = {
    "overhead": (
        ["benchmarks/overhead.py", "--quick"],
        [
            "client ms",
            "alone µs/op",
            "floor µs/op",
            "worker ms",
            "no-sync ms",
            "sync ms",
            "overlap",
            "one message",
        ],
    ),
    "hotpath": (["benchmarks/hotpath.py", "--quick"], ["gt vs eager", "gt vs 1-graph"]),
    "recording": (
        ["benchmarks/recording.py", "--quick"],
        ["followed", "unmatched", "first capture", "ops/s"],
    ),
    "stall": (["benchmarks/stall.py", "--quick"], ["while compiling", "no compile in flight"]),
    "warm_start": (["benchmarks/warm_start.py", "--quick"], ["detection→compiled"]),
    "memory": (["benchmarks/memory.py", "--quick"], ["client MB", "worker MB", "growth after"]),
    "data": (
        ["benchmarks/data.py", "--quick"],
        [
            "+upload ms",
            "up GB/s",
            "down GB/s",
            "vs eager",
            "max |param - eager|",
            "torch.compile",
            "A dataset of one's own",
        ],
    ),
    "models": (
        ["benchmarks/models.py", "--quick", "--iters", "6", "--only", "bert", "--only", "resnet"],
        ["ms per iteration", "bert", "resnet", "torch.compile", "vs eager"],
    ),
    "distributed": (
        ["benchmarks/distributed.py", "--quick"],
        [
            "1 worker ms",
            "2 ranks ms",
            "2 sharded ms",
            "ratio",
            "rank 0:",
            "rank 1:",
            "Shard(dim=0)",
        ],
    ),
    "dtensor_losses": (
        ["benchmarks/dtensor_losses.py", "--quick"],
        ["weight grad", "mse_loss", "Partial(avg)", "Partial(sum)"],
    ),
    "bench": (
        ["-m", "gt_bench.bench", "--quick"],
        ["ms per iteration", "speedup", "torch.compile", "total s", "break-even it", "vs eager"],
    ),
}


def run_quick(args, returncode=0):
    env = dict(os.environ, TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS="0")
    p = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert p.returncode == returncode, p.stdout[-2000:] + p.stderr[-4000:]
    return p


@pytest.mark.parametrize("name", list(QUICK))
def test_quick_benchmark_runs(name, tmp_path):
    args, expected = QUICK[name]
    if name == "bench":
        args = [*args, "--json", str(tmp_path / "bench.json")]
    p = run_quick(args)
    for s in expected:
        assert s in p.stdout, (s, p.stdout[-2000:])
    if name in ("bench", "hotpath"):  # a missing figure is a '-' or a note, not a nan
        assert not re.search(r"\bnan\b", p.stdout), p.stdout[-2000:]
    if name == "bench":
        check_bench(p, tmp_path / "bench.json")
    if name == "hotpath":  # the one-graph step exists for both SGD workloads
        rows = [
            ln.split() for ln in p.stdout.splitlines() if ln.startswith(("mlp ", "transformer"))
        ]
        assert {r[0] for r in rows} == {"mlp", "transformer"}
        assert all(r[4] != "-" and r[6].endswith("x") for r in rows), p.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: gpu.py runs in full")
def test_gpu_benchmark_says_it_needs_a_gpu_where_there_is_none():
    p = run_quick(["benchmarks/gpu.py"], returncode=2)
    assert "needs a CUDA device" in p.stdout, p.stdout


def test_the_gpu_check_runs_every_way_on_the_cpu_and_gt_equals_eager(tmp_path):
    """What runs the moment a GPU is lent, here on the CPU: every way times, gt and jit give
    eager's numbers, and the jit block's state is printed. (aot_eager: the plumbing, without
    four cold inductor compiles; the gpu-marked test below runs inductor on a device.)"""
    path = tmp_path / "gpu.json"
    argv = ["--device", "cpu", "--quick", "--backend", "aot_eager", "--json", str(path)]
    p = run_quick(["benchmarks/gpu.py", *argv])
    doc = json.loads(path.read_text())
    assert doc["backend"] == "aot_eager"
    rows = {(r["model"], r["way"]): r for r in doc["rows"]}
    ways = ("eager", "compile", "compile-ro", "gt", "jit")
    assert set(rows) == {("gpt2-small", w) for w in ways}, p.stdout
    for (_, way), r in rows.items():
        assert "error" not in r, r
        assert r["wall_ms"] > 0 and r["client_ms"] >= 0, r
        assert (r["worker_ms"] is not None) == (way in ("gt", "jit")), r
        assert r["device_ms"] is None  # (no device here: the CPU's figures are the wall's)
    for way in ("gt", "jit"):
        assert rows["gpt2-small", way]["diff"] <= 1e-5, rows["gpt2-small", way]
    jit = rows["gpt2-small", "jit"]["block"]
    # The block compiled and ran compiled; the judge may keep it or revert it for its speed
    # (a timing, aot_eager's on a shared CPU), never for its numbers.
    assert jit["compiled_runs"] > 0 and jit["replayed_runs"] > 0, jit
    assert jit["status"] == "compiled" or "slower than eager" in jit["fallback"], jit
    assert "block: " in p.stdout and "CUDA graphs" in p.stdout, p.stdout


def check_bench(p, path):
    """Every workload has its torch.compile baseline, agreeing with eager; totals in the table."""
    data = json.loads(path.read_text())
    assert [r["workload"] for r in data["results"]] == list(bench.WORKLOADS)
    for r in data["results"]:
        for key in ("torch_compile_ms", "torch_compile_speedup", "torch_compile_total_s"):
            assert r[key] > 0, (key, r)
        assert r["eager_total_s"] > 0 and r["gt_total_s"] > 0, r
        assert r["torch_compile_rel_diff"] <= bench.RTOL, r
        assert isinstance(r["gt_rel_diff"], float), r
        row = next(ln for ln in p.stdout.splitlines() if ln.startswith(r["workload"]))
        assert f"{r['eager_total_s']:.2f}" in row and f"{r['gt_total_s']:.2f}" in row, row
        assert f"{r['torch_compile_speedup']:.2f}x" in row, row
    # Progress goes to stderr, one line at a time when it is not a TTY; stdout has the table.
    assert "…" not in p.stdout and "  … " in p.stderr and "\r" not in p.stderr


def test_progress_lines_when_not_a_tty():
    out = io.StringIO()
    progress = bench._Progress(out, tty=False, min_s=0)
    tick = progress.phase("w", "gt", 100)
    for i in range(1, 101):
        tick(i)
    progress.done("w: gt 1.000 ms/it")
    progress.close()
    lines = out.getvalue().splitlines()
    assert [ln.split()[3] for ln in lines[:-1]] == ["25/100", "50/100", "75/100"], lines
    assert lines[-1] == "  … w: gt 1.000 ms/it"


def test_progress_quiet_on_short_phases_and_in_place_on_a_tty():
    out = io.StringIO()
    progress = bench._Progress(out, tty=False, min_s=60)
    tick = progress.phase("w", "eager", 8)
    for i in range(1, 9):
        tick(i)
    assert out.getvalue() == ""  # a short phase: only the line that ends it

    out = io.StringIO()
    progress = bench._Progress(out, tty=True)
    tick = progress.phase("w", "gt", 1000)
    for i in range(1, 1001):
        tick(i)
    progress.done("w: gt 1.000 ms/it")
    progress.close()
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") < 20 and text.endswith("\r\x1b[K")
    assert "w: gt 1000/1000 (100%)" in text


def test_table_has_every_column():
    r = bench.Result(
        workload="w",
        iters=3,
        eager_ms=2.0,
        gt_ms=1.0,
        torch_compile_ms=4.0,
        speedup=2.0,
        torch_compile_speedup=0.5,
        eager_total_s=0.25,
        gt_total_s=0.75,
        torch_compile_total_s=1.5,
        gt_warmup_s=0.1,
        gt_compile_s=None,
        break_even=None,
        gt_rel_diff=0.0,
        torch_compile_rel_diff=5e-2,
        status="compiled",
        verdict="faster",
        jit_ms=0.5,
        jit_speedup=4.0,
    )
    text = bench.table([r])
    head, row = text.splitlines()[1], text.splitlines()[3]
    assert head.split() == [
        "workload", "eager", "gt", "jit", "torch.compile", "gt", "jit", "torch.compile", "eager", "gt",
        "torch.compile", "compile", "s", "warmup", "s", "break-even", "it", "vs", "eager",
        "verdict",
    ]  # fmt: skip
    assert row.split() == [
        "w", "2.000", "1.000", "0.500", "4.000", "2.00x", "4.00x", "0.50x", "0.25", "0.75", "1.50", "-",
        "0.10",
        "-", "DIFFERS:", "tc", "5.0e-02", "faster",
    ]  # fmt: skip
    assert "ms per iteration" in text.splitlines()[0] and "total s" in text.splitlines()[0]


def test_a_torch_compile_baseline_that_fails_is_a_figure_not_the_end_of_the_run(
    inprocess, monkeypatch
):
    """torch.compile of a training step under CUDA graphs can raise (its optimizer graph reads
    gradients another graph's replay overwrote): the row says so, and the run goes on."""

    def fails(*args):
        raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten\nmore")

    monkeypatch.setattr(bench, "_torch_compile_loop", fails)
    r = bench.run("MLP training step", iters=6, backend="eager")
    assert r.torch_compile_ms is None and r.torch_compile_speedup is None
    assert r.torch_compile_error == (
        "failed: RuntimeError: accessing tensor output of CUDAGraphs that has been overwritten"
    )
    row = bench.table([r]).splitlines()[3]
    assert "tc failed: RuntimeError: accessing tensor output" in row
    assert r.eager_ms > 0 and r.gt_ms > 0 and r.jit_ms > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gpu_check_on_a_gpu_gives_eagers_numbers_and_times_the_device(tmp_path):
    path = tmp_path / "gpu.json"
    run_quick(["benchmarks/gpu.py", "--device", "cuda", "--quick", "--json", str(path)])
    rows = {(r["model"], r["way"]): r for r in json.loads(path.read_text())["rows"]}
    for way in ("gt", "jit"):
        r = rows["gpt2-small", way]
        assert r["diff"] <= 1e-5 and r["device_ms"] is not None, r
    assert rows["gpt2-small", "eager"]["device_ms"] > 0
