"""A torch.compile backend that never finishes: it keeps a thread inside torch's C++ code.

Imported by the client (where options check the backend's name) and by the worker
(worker_imports=("_busy_backend",)), where a block's compile runs it in a thread of its own,
as compiles with any backend but the compile process's inductor do (a GPU worker's too).
"""

import time

import torch
from torch._dynamo import register_backend

_BUSY_S = 120.0  # longer than any test waits: the process ends first


@register_backend
def gt_busy(gm, example_inputs):
    """Matrix products until the process ends (each one releases the GIL and takes it back)."""
    a = torch.randn(64, 64)
    end = time.monotonic() + _BUSY_S
    while time.monotonic() < end:
        a @ a
    return gm
