"""A gt process ends cleanly: its worker and the worker's threads end before any teardown.

An interpreter torn down under a thread inside torch's C++ code aborts that process with
"terminate called without an active exception". The worker's compiles run in threads of it
(a compile process's inductor aside) and cannot be stopped; a script that ends while one runs
must still end with status 0 and a quiet stderr, its worker with status 0.
"""

import os
import subprocess
import sys
import textwrap

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))

# The script trains a few jitted steps, so that the step's block compiles in the worker, and
# ends while the compile runs. Its first exit handler is the last to run: after gt's own
# (registered on first use), it says how the worker ended.
_SCRIPT = """
import atexit
procs = []
atexit.register(lambda: print("worker exit status", procs[0].exitcode, flush=True))

import torch
from torch import nn
import gt_core
from gt_core.client.capture import session

{configure}
with gt_core.capture():
    procs.append(session().transport.proc)
    m = nn.Linear(8, 4)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 8), torch.randn(16, 4)

    @gt_core.jit
    def step(x, y):
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    for _ in range(5):
        loss = step(x, y)
    print("loss", float(loss), flush=True)
    gt_core.wait()  # the compile has started (and, with the busy backend, goes on)
    print(*[e["type"] for e in gt_core.events_log().snapshot() if e["type"].startswith("compile.")])
    {end}
"""

# busy: the block's compile runs in a thread of the worker and never ends (_busy_backend);
# inductor: it runs in the compile process, the worker's thread waiting for it.
_CONFIGURE = {
    "busy": "import _busy_backend\n"
    'gt_core.configure(backend="gt_busy", worker_imports=("_busy_backend",))',
    "inductor": 'gt_core.configure(backend="inductor", auto_compile=True)',
}


def _run(configure: str, end: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent(_SCRIPT).format(configure=configure, end=end)
    path = os.pathsep.join([_HERE, os.path.dirname(_HERE), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, GT_DEVICE="cpu")
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("backend", "end", "status"),
    [
        pytest.param("busy", "pass", 0, id="busy-end"),
        # (Python ends a KeyboardInterrupt by a SIGINT to itself)
        pytest.param("busy", "raise KeyboardInterrupt", -2, id="busy-ctrl-c"),
        pytest.param("inductor", "pass", 0, id="inductor-end", marks=pytest.mark.inductor),
    ],
)
def test_a_script_ends_cleanly_while_its_block_compiles(backend, end, status):
    r = _run(_CONFIGURE[backend], end)
    said = f"status {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "compile.started" in r.stdout, said
    assert "terminate called" not in r.stderr, said
    assert "Fatal Python error" not in r.stderr, said
    assert r.returncode == status, said
    assert "worker exit status 0" in r.stdout, said
