"""``python -m gt_core.worker_process --listen HOST:PORT --authkey-file FILE``: a remote worker.

In [1]: gt_core.connect("HOST:PORT", authkey=open("FILE", "rb").read().strip())

Started by ``torchrun`` (``torchrun --nproc-per-node 2 -m gt_core.worker_process --listen ...``), every
process is a rank of a worker group and the client connects to rank 0 (gt_core.worker_process.torchrun).
"""

from __future__ import annotations

import argparse
import sys

from gt_core.worker_process.listen import DEFAULT_HOST, parse_address, read_authkey, serve_clients
from gt_core.worker_process.torchrun import in_torchrun, serve_group


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gt_core.worker_process",
        description="A gt worker that a notebook on another machine (or this one) connects to.",
    )
    parser.add_argument(
        "--listen",
        required=True,
        metavar="HOST:PORT",
        help=f"where to listen (a PORT alone binds {DEFAULT_HOST}; port 0 picks a free one)",
    )
    parser.add_argument(
        "--authkey-file",
        required=True,
        metavar="FILE",
        help="a file holding the key clients must prove they hold (before anything runs)",
    )
    parser.add_argument(
        "--clients", type=int, default=None, metavar="N", help="exit after N clients"
    )
    args = parser.parse_args(argv)
    try:
        address = parse_address(args.listen)
        key = read_authkey(args.authkey_file)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    try:
        if in_torchrun():  # a rank of a worker group: rank 0 listens, the others follow
            serve_group(address, key, clients=args.clients)
        else:
            serve_clients(address, key, clients=args.clients)
    except OSError as exc:  # the address is taken, or not this machine's
        print(f"gt remote worker: cannot listen on {args.listen}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
