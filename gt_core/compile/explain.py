"""What a compile made and where its time went: the FX code, the backend's generated code,
the seconds of each phase and whether inductor's cache had it (what the explorer shows).

Read from inductor's own records around one compile: its per-phase timers
(``torch._dynamo.utils.compilation_time_metrics``), its cache counters and the compiled
graph's ``source_code``. A phase inductor did not report is left out, never guessed.
"""

from __future__ import annotations

import contextlib
import time

__all__ = ["measured", "code_of", "CODE_LIMIT"]

# The generated code of one block travels in an event: past this it is cut (and says so).
CODE_LIMIT = 200_000

# A phase: (its name, inductor's timer, the timer nested in it that is another phase)
_PHASES = (
    ("aot", "create_aot_dispatcher_function", "compile_fx_inner"),
    ("inductor", "compile_fx_inner", "PyCodeCache.load_by_key_path"),
    ("kernel_compile", "PyCodeCache.load_by_key_path", None),  # C++ / Triton builds, loading
)


@contextlib.contextmanager
def measured():
    """Yields a dict that holds, once the block ends, ``phases`` ({name: seconds}) and
    ``cache`` ("hit", "miss", "bypass" or None) of the compiles inside it."""
    from torch._dynamo.utils import compilation_time_metrics as timers
    from torch._dynamo.utils import counters

    before = {k: sum(v) for k, v in timers.items()}
    cache = dict(counters["inductor"])
    out: dict = {"phases": {}, "cache": None}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        spent = {k: sum(v) - before.get(k, 0.0) for k, v in timers.items()}
        for name, outer, inner in _PHASES:
            if spent.get(outer):
                out["phases"][name] = round(max(spent[outer] - spent.get(inner, 0.0), 0.0), 4)
        seen = {
            k: counters["inductor"][f"fxgraph_cache_{k}"] - cache.get(f"fxgraph_cache_{k}", 0)
            for k in ("hit", "miss", "bypass")
        }
        out["cache"] = next((k for k, n in seen.items() if n), None)
        out["seconds"] = time.perf_counter() - t0


def code_of(gm, compiled) -> dict:
    """{"fx": the graph's Python code, "generated": the backend's code or None}."""
    generated = None
    for obj in (compiled, getattr(compiled, "_compiled_fn", None)):
        src = getattr(obj, "source_code", None)
        if isinstance(src, str):
            generated = src
            break
    return {
        "fx": _cut(gm.code.strip()),
        "generated": None if generated is None else _cut(generated),
    }


def _cut(text: str) -> str:
    if len(text) <= CODE_LIMIT:
        return text
    return text[:CODE_LIMIT] + f"\n# ... cut: {len(text) - CODE_LIMIT} more characters"
