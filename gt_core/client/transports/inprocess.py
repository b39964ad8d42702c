"""The worker in the client's own process: the same executor and engine, no second process.

For debugging and fast tests. Worker code runs here as it would in the worker process: no
capture mode, no autograd, and marked as the worker's (gt_core.diagnostics.stance).
"""

from __future__ import annotations

import contextlib
import os
import time

import torch

from gt_core.client.transports.transport import Transport
from gt_core.observe import events as ev
from gt_core.stream.requests import Fetch

__all__ = ["InProcessTransport"]


@contextlib.contextmanager
def _isolated():
    """Run worker code in the client's process as the worker process would: no capture, no grad."""
    from torch.utils._python_dispatch import _disable_current_modes

    from gt_core.diagnostics.stance import in_worker as _in_worker

    keys = torch._C.DispatchKey
    # The client may reach here inside _DisableTorchDispatch (an upload flushing the stream):
    # the worker's compiles trace with fake tensors, which need the Python dispatch keys that
    # guard excludes.
    with (
        _in_worker.running(),
        torch._C._SetExcludeDispatchKeyGuard(keys.Python, False),
        torch._C._SetExcludeDispatchKeyGuard(keys.PythonTLSSnapshot, False),
        _disable_current_modes(),
        torch.no_grad(),
    ):
        yield


class InProcessTransport(Transport):
    """The executor in this process: same code path, no second process (debugging, tests)."""

    def __init__(self, options, on_events):
        from gt_core.stream.instructions import import_op_modules
        from gt_core.worker_process.serve import Worker

        self._on_events = on_events
        import_op_modules(options.worker_imports)
        self.worker = Worker(options, on_events)
        self.ex, self.engine = self.worker.ex, self.worker.engine
        self.pid, self.device = os.getpid(), str(self.worker.device)
        on_events(
            [ev.event(ev.WORKER, state="started", pid=self.pid, device=self.device, inprocess=True)]
        )
        self._alive = True

    def send(self, batch):
        with _isolated():
            self.worker.feed(batch)

    def request(self, req):
        from gt_core.worker_process.serve import serve

        with _isolated():
            status, value = serve(self.worker, ("req", 0, req))
            self.worker.publish_events()
        if type(req) is Fetch and status == "ok":
            # A copy: the worker's own tensor would change with later steps (a saved state
            # dict, a model moved to the CPU). A process worker's answer is one by staging.
            t0 = time.perf_counter()
            with _isolated():
                value = torch.empty_like(value, device="cpu").copy_(value)
            self.copy_ms = (time.perf_counter() - t0) * 1e3
        if status == "err":
            raise value
        return value

    def alive(self):
        return self._alive

    def stop(self):
        if self._alive:
            self.worker.close()
        self._alive = False
