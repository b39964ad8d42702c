"""The tutorial notebooks, executed end to end in a fresh kernel (quick settings)."""

from pathlib import Path

import nbformat
import pytest

from gt_jupyter.execute import execute

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
QUICK = {"GT_NOTEBOOK_QUICK": "1", "TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}


def outputs(nb, kind: str = "text/plain") -> list[str]:
    out = []
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            out.append(o.get("data", {}).get(kind, "") if "data" in o else o.get("text", ""))
    return out


def run(name: str, tmp_path) -> nbformat.NotebookNode:
    path = execute(NOTEBOOKS / name, tmp_path, timeout=600, env=QUICK, echo=lambda s: None)
    nb = nbformat.read(path, as_version=4)
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
    return nb


def test_every_notebook_is_tested():
    tested = {
        "01_quickstart.ipynb",
        "02_signatures_and_hot_paths.ipynb",
        "03_recompiles.ipynb",
        "04_benchmark.ipynb",
    }
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == tested


@pytest.mark.notebook
def test_quickstart(tmp_path):
    nb = run("01_quickstart.ipynb", tmp_path)
    text = "\n".join(outputs(nb))
    assert "1 hot path (1 compiled)" in text  # the dashboards, final
    assert "[compiled] 41 ops" in text
    html = "\n".join(outputs(nb, "text/html"))
    assert "plotly" in html and "<table>" in html  # the static fallback is saved
    gt_loss, eager_loss = (
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith(("gt loss", "eager loss"))
    )
    assert gt_loss == pytest.approx(eager_loss, rel=1e-3, abs=1e-6)


@pytest.mark.notebook
def test_signatures_and_hot_paths(tmp_path):
    nb = run("02_signatures_and_hot_paths.ipynb", tmp_path)
    text = "\n".join(outputs(nb))
    assert "(same: ids are renumbered)" in text
    assert "[32, 64] → [16, 64]" in text or "[32, 64]" in text and "[16, 64]" in text
    assert "dependency graph" in text


@pytest.mark.notebook
def test_recompiles(tmp_path):
    nb = run("03_recompiles.ipynb", tmp_path)
    text = "\n".join(outputs(nb))
    assert "recompile limit hit: True" in text
    after = next(ln for ln in text.splitlines() if ln.startswith("compiles after the fix:"))
    assert int(after.split(":")[1].split()[0]) <= 2 and "(recompiles: 0)" in after
    assert "_current_idx" in text  # the guard that failed, named
    assert "graph break" in text.lower() and "MAE against eager, routed through gt" in text


@pytest.mark.notebook
def test_benchmark(tmp_path):
    nb = run("04_benchmark.ipynb", tmp_path)
    text = "\n".join(outputs(nb))
    for workload in ("matmul chain", "MLP", "attention", "mixed"):
        assert workload.lower() in text.lower()
