"""A JupyterLab server and a headless Chromium for the browser tests.

The server runs this checkout's kernel (PYTHONPATH points at the repository) on 127.0.0.1
with a random token; Chromium is Debian's (``/usr/bin/chromium``), driven by Playwright:
Playwright's own browser download cannot work on a machine without internet.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("GT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def missing() -> str | None:
    """Why the browser tests cannot run here (None when they can)."""
    try:
        import jupyterlab  # noqa: F401, PLC0415
        import playwright.sync_api  # noqa: F401, PLC0415
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install -e '.[test]')"
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium, or set GT_CHROMIUM)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """A JupyterLab server on a folder of its own; ``url(path)`` opens a notebook in it."""

    def __init__(self, root_dir: Path):
        self.root = root_dir
        self.port = _free_port()
        self.token = secrets.token_hex(16)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
        env["JUPYTER_CONFIG_DIR"] = str(root_dir / ".jupyter-config")  # no user settings
        self.log = open(root_dir / "lab.log", "wb")  # noqa: SIM115 (closed in stop)
        # Notebook signatures of this server alone: a copied notebook is untrusted whatever the
        # user's own signature database says.
        self.db_file = root_dir / ".jupyter-config" / "nbsignatures.db"
        self.secret_file = root_dir / ".jupyter-config" / "notebook_secret"
        self.secret_file.parent.mkdir(exist_ok=True)
        self.secret_file.write_bytes(secrets.token_bytes(64))
        self.secret_file.chmod(0o600)
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "jupyterlab", "--no-browser",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}",
                f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root_dir}",
                f"--NotebookNotary.db_file={self.db_file}", f"--NotebookNotary.secret_file={self.secret_file}",
                "--allow-root", "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ],
            env=env, cwd=root_dir, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self._wait()

    def api(self, path: str) -> dict:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/api/{path}",
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 (loopback)
            return json.loads(r.read())

    def _wait(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited: {(self.root / 'lab.log').read_text()[-2000:]}"
                )
            try:
                self.api("status")
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError("jupyter lab did not answer within 60 s")

    def url(self, path: str) -> str:
        """The notebook's page; ``reset``: no notebooks of earlier pages restored beside it."""
        return f"http://127.0.0.1:{self.port}/lab/tree/{path}?reset&token={self.token}"

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def write_notebook(path: Path, cells: list[str]) -> Path:
    import nbformat  # noqa: PLC0415

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, path)
    return path
