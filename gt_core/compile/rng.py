"""Background compiles and the worker's random generators.

A private torch API (torch 2.13): ``torch._dynamo.utils.preserve_rng_state``, patched where
modules imported it by name. Check it here on a torch upgrade.
"""

from __future__ import annotations

__all__ = ["keep_rng_in_threads"]


def keep_rng_in_threads(prefix: str) -> None:
    """Make torch's ``preserve_rng_state`` leave the generators alone in threads named
    ``prefix...`` (gt's background compiles); elsewhere it saves and restores as before.

    AOTAutograd and inductor wrap a whole compile in it: saved at the start, restored at the
    end. A compile in a thread of the worker ends while the worker's own thread has drawn
    random numbers meanwhile (dropout in the eager runs beside the compile), and the restore
    rewound the generator under it: later steps drew the same masks again, and the results
    differed from eager without an error. Compiles trace fake tensors, which draw nothing.
    Idempotent. Reached by name: torch._dynamo.utils, and the modules that imported it so.
    """
    import contextlib
    import sys
    import threading

    from torch._dynamo import utils

    original = utils.preserve_rng_state
    if getattr(original, "gt_threads", None) == prefix:
        return

    @contextlib.contextmanager
    def preserve_rng_state():
        if threading.current_thread().name.startswith(prefix):
            yield
            return
        with original():
            yield

    preserve_rng_state.gt_threads = prefix
    for name in ("torch._dynamo.utils", "torch._functorch.aot_autograd", *_RNG_USERS):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "preserve_rng_state", None) is original:
            module.preserve_rng_state = preserve_rng_state


# Modules that import preserve_rng_state by name (patched where already imported; imported
# later, they take the patched one).
_RNG_USERS = (
    "torch._inductor.select_algorithm",
    "torch._inductor.cudagraph_trees",
    "torch._inductor.codegen.triton",
)
