"""The layout's rules: import-linter's contracts (pyproject.toml: layers, no arrow that skips one),
no import cycle, small modules, names that resolve."""

import ast
import importlib
import re
import subprocess
import sys
import tokenize
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
    code = (
        "import sys, gt_core.observe.report, gt_core.observe.events; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_DOTTED = re.compile(r"\bgt_(?:core|jupyter)(?:\.[A-Za-z_]\w*)+")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute reached from the longest module."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for name in parts[n:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_dotted_names_in_comments_and_docstrings_resolve():
    """A comment or docstring that names a module or attribute of gt_core by its dotted path
    names one that exists (a renamed or removed name leaves no stale reference)."""
    stale = []
    for path in [
        *_sources(),
        *sorted((ROOT / "tests").glob("*.py")),
        *sorted((ROOT / "benchmarks").glob("*.py")),
    ]:
        with tokenize.open(path) as f:
            tokens = list(tokenize.generate_tokens(f.readline))
        for tok in tokens:
            if tok.type not in (tokenize.COMMENT, tokenize.STRING):
                continue
            for name in set(_DOTTED.findall(tok.string)):
                if not _resolves(name):
                    stale.append(f"{path.relative_to(ROOT)}:{tok.start[0]}: {name}")
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        stale += [
            f"{path.name}: {n}" for n in set(_DOTTED.findall(path.read_text())) if not _resolves(n)
        ]
    assert not stale, "\n".join(stale)


def test_no_module_is_named_like_a_lazy_public_name():
    """gt_core's client names load on first use: a submodule of the same name would bind the
    module over the name when imported first (``gt_core.config`` is a function)."""
    import gt_core

    modules = {p.stem for p in (ROOT / "gt_core").iterdir() if p.suffix == ".py" or p.is_dir()}
    assert not modules & set(gt_core._CLIENT), modules & set(gt_core._CLIENT)
