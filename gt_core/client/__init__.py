"""The client, in the kernel's process: proxies, recording, plans followed, the session, jit.

A proxy's behaviour comes from three modules: proxy (the class), record (its ops, recorded:
``__torch_dispatch__``) and tensor_io (pickling, copies, moves): imported here, so a proxy
is whole whichever client module is imported first.
"""

from gt_core.client import proxy as _proxy  # noqa: F401
from gt_core.client import record as _record  # noqa: F401
from gt_core.client import tensor_io as _tensor_io  # noqa: F401
