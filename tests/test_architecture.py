"""The layout's rules: import-linter's contracts (pyproject.toml), no import cycle, small modules."""

import ast
import subprocess
import sys
from pathlib import Path

import grimp
import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gt_core", "gt_jupyter")
MODULE_LINES = 400  # a module read in one sitting
CLASS_LINES = 250


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


def test_no_import_cycle_between_modules():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)  # a stale cache hides edits
    g = nx.DiGraph()
    for m in graph.modules:
        for imported in graph.find_modules_directly_imported_by(m):
            g.add_edge(m, imported)
    cycles = [" -> ".join(c) for c in nx.simple_cycles(g)]
    assert not cycles, "\n".join(sorted(cycles, key=len))


def test_modules_and_classes_are_small():
    big = []
    for path in _sources():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MODULE_LINES:
            big.append(f"{path.relative_to(ROOT)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                n = node.end_lineno - node.lineno + 1
                if n > CLASS_LINES:
                    big.append(f"{path.relative_to(ROOT)}: class {node.name} {n} lines")
    assert not big, "\n".join(big)


def test_observe_imports_no_torch():
    code = "import sys, gt_core.observe.report, gt_core.observe.events; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
