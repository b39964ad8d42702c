"""How a worker process ends: its exit handlers run, then it exits at once.

Its interpreter is never torn down. Teardown ends the threads still running (a compile in a
thread of the worker, which cannot be stopped) as they next take the GIL, by unwinding their
stacks; one inside torch's C++ code then aborts the process with "terminate called without an
active exception" on the client's stderr. The worker has nothing of its own left to finalize
after its cleanup, so it exits as a killed process would, but after its exit handlers
(multiprocessing's, inductor's, weakref finalizers) and with its output flushed.
"""

from __future__ import annotations

import atexit
import os
import sys
import traceback
from typing import NoReturn

__all__ = ["end_process", "run_then_end"]


def end_process(code: int = 0) -> NoReturn:
    """Run the exit handlers, flush stdout and stderr, and exit with ``code`` (no teardown)."""
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # (closed, or None: nothing to flush)
                pass
        os._exit(code)


def run_then_end(main, *args, **kwargs) -> NoReturn:
    """A worker process's body: ``main(*args, **kwargs)``, then end_process (with status 1
    if it raised, or a SystemExit's)."""
    code = 0
    try:
        main(*args, **kwargs)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    end_process(code)
