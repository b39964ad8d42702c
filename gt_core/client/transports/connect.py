"""``gt_core.connect("HOST:PORT", authkey=...)``: later captures use a remote worker.

In [1]: gt_core.connect("127.0.0.1:7077", authkey=open("key", "rb").read().strip())
In [2]: with gt_core.capture(): ...   # tensors live on that worker
"""

from __future__ import annotations

from gt_core.client.capture import configure, session, worker
from gt_core.client.transports.tcp import set_authkey
from gt_core.errors import ConfigError

__all__ = ["connect"]


def connect(address: str, authkey: bytes | str | None = None, authkey_file: str | None = None):
    """Use the remote worker at ``address`` (``HOST:PORT``) from now on; its WorkerHandle.

    The worker in use now stops (its tensors are lost); the connection is made here, so a
    wrong key or an unreachable address is raised at once (gt_core.RemoteRefused). The key
    comes from ``authkey``, else ``authkey_file``, else the authkey_file option
    (GT_AUTHKEY_FILE). ``connect("process")`` goes back to a local worker.
    """
    target = address if address in ("process", "inprocess") else _tcp(address)
    if authkey is not None:
        set_authkey(target, authkey)
    changes = {"worker": target}
    if authkey_file is not None:
        changes["authkey_file"] = authkey_file
    worker().stop()
    configure(**changes)
    session()
    return worker()


def _tcp(address: str) -> str:
    from gt_core.worker_process.listen import parse_address

    try:
        host, port = parse_address(address)
    except ValueError as exc:
        raise ConfigError("address", address, str(exc).split(": ", 1)[-1]) from None
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
