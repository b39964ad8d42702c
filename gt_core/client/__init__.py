"""The client, in the kernel's process: proxies, recording, plans followed, the session, jit."""

# proxy and record import each other (a proxy's ops are recorded; recording makes proxies):
# proxy goes first, whichever client module is imported first.
from gt_core.client import proxy as _proxy  # noqa: F401
