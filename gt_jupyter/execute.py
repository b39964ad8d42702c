"""Run a notebook headless in a kernel of this Python and save the executed copy.

    python -m gt_jupyter.execute notebooks/01_quickstart.ipynb [--out DIR] [--timeout S]

The executed notebook keeps every output: the dashboards' figures as plotly JSON (drawn by
a trusted JupyterLab) and as SVG images (drawn untrusted, on GitHub, in nbviewer); widget
state, should a cell display widgets of its own, is not saved. What
gt said (the dashboards' one-line headlines) is printed as the notebook runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["execute", "main"]


def _kernel_manager():
    """A kernel manager whose ``python3`` is this interpreter (whatever else is installed)."""
    from ipykernel.kernelspec import write_kernel_spec  # noqa: PLC0415
    from jupyter_client.kernelspec import KernelSpecManager  # noqa: PLC0415
    from jupyter_client.manager import KernelManager  # noqa: PLC0415

    root = Path(tempfile.mkdtemp(prefix="gt-kernel-"))
    write_kernel_spec(root / "python3")
    specs = KernelSpecManager(kernel_dirs=[str(root)], ensure_native_kernel=False)
    return KernelManager(kernel_name="python3", kernel_spec_manager=specs)


def _headlines(cell) -> list[str]:
    out = []
    for o in cell.get("outputs", []):
        text = o.get("data", {}).get("text/plain", "") if "data" in o else o.get("text", "")
        out += [line for line in str(text).splitlines() if line.startswith("gt: ")]
    return out


def execute(
    path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    timeout: int = 900,
    env: dict | None = None,
    echo=None,
) -> Path:
    """Execute the notebook at ``path``; write it to ``out_dir`` (default: ``executed/`` next
    to it) and return the written path. A failing cell raises after the partial notebook is
    saved. ``env``: extra environment variables for the kernel."""
    import nbformat  # noqa: PLC0415
    from nbclient import NotebookClient  # noqa: PLC0415

    src = Path(path)
    nb = nbformat.read(src, as_version=4)
    out = Path(out_dir) if out_dir is not None else src.parent / "executed"
    out.mkdir(parents=True, exist_ok=True)
    target = out / src.name
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    client = NotebookClient(
        nb,
        timeout=timeout,
        km=_kernel_manager(),
        resources={"metadata": {"path": str(src.parent)}},
        extra_arguments=["--IPKernelApp.log_level=ERROR"],  # no transport warnings
    )

    say = echo or print
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]

    def on_cell_executed(cell, cell_index, execute_reply):
        first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
        say(f"  cell {code.index(cell_index) + 1}/{len(code)}: {first[:70]}")

    client.on_cell_executed = on_cell_executed
    try:
        client.execute()
        # The dashboards' final headlines (a dashboard may be updated after its cell ran).
        for i in code:
            for line in _headlines(nb.cells[i]):
                say(f"cell {code.index(i) + 1}: {line}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        nbformat.write(_static(nb), target)
    return target


_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _static(nb):
    """The notebook as saved: each output's static HTML, not its live widget.

    Widget state can embed whole libraries (plotly's FigureWidget: plotly.js per figure, MB
    each), and a widget view whose state is not saved shows as an error in Jupyter: a view
    that has another representation keeps that one (the explorer's: its static copy).
    """
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            data = o.get("data")
            if data and _WIDGET_VIEW in data and len(data) > 1:
                del data[_WIDGET_VIEW]
    return nb


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gt_jupyter.execute", description=__doc__.splitlines()[0]
    )
    ap.add_argument("notebook", help="the .ipynb to run")
    ap.add_argument(
        "--out", metavar="DIR", help="where the executed copy goes (default: executed/ beside it)"
    )
    ap.add_argument("--timeout", type=int, default=900, help="seconds per cell (default 900)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print(f"running {args.notebook} …", flush=True)
    try:
        target = execute(
            args.notebook, args.out, timeout=args.timeout, echo=lambda s: print(s, flush=True)
        )
    except Exception as exc:  # a failing cell: say which, where the partial copy is
        first = str(exc).strip().splitlines()
        print(f"failed: {type(exc).__name__}: {' '.join(first[-3:])[:2000]}", file=sys.stderr)
        return 1
    print(f"done in {time.perf_counter() - t0:.0f} s; open {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
