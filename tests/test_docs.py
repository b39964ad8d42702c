"""The README is an entry point and the docs a site that builds: strict (a broken link, a
missing page or an unresolved reference is an error), every page reachable from its nav."""

import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_the_readme_is_an_entry_point_of_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    assert lines[0].startswith("# gt")


def test_every_link_of_the_readme_reaches_a_file():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)\)", text):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_the_docs_site_builds_strict(tmp_path):
    """``mkdocs build --strict``: warnings fail it; the API pages come from the docstrings,
    the configuration table from the options, the tutorials from the notebooks."""
    out = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    site = tmp_path / "site"
    config = (site / "configuration" / "index.html").read_text()
    assert "GT_JIT_AUDIT" in config and "{{ options_table }}" not in config
    assert (site / "tutorials" / "05_jit" / "index.html").exists()
    assert "gt_core.client.jit.function.jit" in (site / "api" / "index.html").read_text()
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.name in nav, f"{page.name} is in no nav of mkdocs.yml"
