"""Issue 7, item 8: every benchmark script's quick version runs (no timing is asserted)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

QUICK = {
    "overhead": (["benchmarks/overhead.py", "--quick"], "µs/op client"),
    "hotpath": (["benchmarks/hotpath.py", "--quick"], "gt vs eager"),
    "stall": (["benchmarks/stall.py", "--quick"], "while compiling"),
    "warm_start": (["benchmarks/warm_start.py", "--quick"], "detection→compiled"),
    "bench": (["-m", "gt_core.bench", "--quick"], "eager"),
}


@pytest.mark.parametrize("name", list(QUICK))
def test_quick_benchmark_runs(name):
    args, expected = QUICK[name]
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
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    assert expected in p.stdout, p.stdout[-2000:]
