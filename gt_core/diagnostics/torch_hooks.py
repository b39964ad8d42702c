"""Every private torch API that gt_core.diagnostics relies on, in one place (torch 2.13).

None of these is a stable interface: a torch release may rename or drop any of them. Each
is reached only through this module, so that an upgrade is checked here; callers treat a
missing one as a source that this torch lacks (a ``user.failure`` event naming it), never as
an error in the user's code. Torch is imported where a function needs it: the package's
import stays light.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = [
    "GRAPH_BREAK_LOG",
    "LIMIT_LOG",
    "TENSOR_LOG",
    "CUDAGRAPH_LOG",
    "RESUME",
    "artifact_enabled",
    "cache_entries",
    "compilation_metrics",
    "compiled_fn_of",
    "counted_cudagraph_skips",
    "current_compile_id",
    "disable_current_modes",
    "hook_compilation_event",
    "in_backward",
    "innermost_fn",
    "is_module_wrapper",
    "recompile_limit",
    "resume_codes",
    "set_stance_callback",
    "stance_callback",
]

# Loggers whose records diagnostics turns into events, and the artifact that enables each
# (``TORCH_LOGS``); when the user enabled it, the records are printed as well.
GRAPH_BREAK_LOG = ("torch._dynamo.symbolic_convert.__graph_breaks", "graph_breaks")
LIMIT_LOG = ("torch._dynamo.convert_frame", None)  # the recompile-limit warning
TENSOR_LOG = ("torch._dynamo.variables.tensor", None)  # its own warning about .item() breaks
CUDAGRAPH_LOG = ("torch._inductor.cudagraph_utils.__cudagraphs", "cudagraphs")

# The code objects Dynamo makes at a graph break to run the rest of a function.
RESUME = re.compile(r"^torch_dynamo_resume_in_(?P<fn>.+?)_at_\d+$")


def _dynamo_utils():
    from torch._dynamo import utils

    return utils


# -- compile records and counters ---------------------------------------------------------
def compilation_metrics() -> list:
    """Dynamo's ``CompilationMetrics`` records so far, one per frame compile."""
    return _dynamo_utils().get_compilation_metrics()


def hook_compilation_event(on_record: Callable) -> Callable[[], None]:
    """Call ``on_record(metrics)`` on each record as Dynamo makes it; returns the undo.

    Raises ``AttributeError`` where this torch has no ``log_compilation_event``.
    """
    utils = _dynamo_utils()
    original = utils.log_compilation_event

    def log_compilation_event(metrics):
        on_record(metrics)
        return original(metrics)

    utils.log_compilation_event = log_compilation_event
    return lambda: setattr(utils, "log_compilation_event", original)


def counted_cudagraph_skips() -> int:
    """Inductor's count of cudagraph skips (bumped also where no reason is logged: CPU)."""
    return _dynamo_utils().counters["inductor"]["cudagraph_skips"]


def current_compile_id() -> str | None:
    """The id (``frame/compile``) of the compile running on this thread, or None."""
    import torch

    cid = torch._guards.CompileContext.current_compile_id()
    return str(cid) if cid is not None else None


def recompile_limit(limit_type: str = "recompile_limit") -> int:
    """Dynamo's recompile limit (``recompile_limit``; ``cache_size_limit`` before 2.6)."""
    import torch._dynamo.config as config

    if limit_type != "recompile_limit" and isinstance(getattr(config, limit_type, None), int):
        return getattr(config, limit_type)  # accumulated_recompile_limit
    return int(getattr(config, "recompile_limit", None) or getattr(config, "cache_size_limit", 8))


def artifact_enabled(artifact: str) -> bool:
    """Whether the user enabled a log artifact (``TORCH_LOGS``); False if it cannot be told."""
    try:
        from torch._logging._internal import log_state

        return bool(log_state.is_artifact_enabled(artifact))
    except Exception:
        return False


def is_module_wrapper(filename: str) -> bool:
    """Whether a compiled code object is Dynamo's frame around a ``torch.nn`` module."""
    return filename.replace("\\", "/").endswith("_dynamo/external_utils.py")


# -- the per-call stance ------------------------------------------------------------------
def stance_callback() -> Callable:
    """``_callback_from_stance``, which every call of a compiled function asks for its frame
    callback (None: run the Python as it is)."""
    import torch._dynamo.eval_frame as eval_frame

    return eval_frame._callback_from_stance


def set_stance_callback(callback: Callable) -> None:
    import torch._dynamo.eval_frame as eval_frame

    eval_frame._callback_from_stance = callback


def compiled_fn_of(frame):
    """The function a call of a compiled function runs, from the frame of Dynamo's wrapper
    that asked ``_callback_from_stance`` (its local ``fn``), or None."""
    return frame.f_locals.get("fn")


def in_backward() -> bool:
    """Whether this thread runs an autograd node now (a backward pass is computing)."""
    import torch

    return torch._C._current_autograd_node() is not None


def disable_current_modes():
    """A context without the dispatch modes on this thread (gt's capture records nothing)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


# -- cache entries (explain) --------------------------------------------------------------
def innermost_fn(fn):
    """The user's function (or module) under torch.compile's wrappers."""
    from torch._dynamo.eval_frame import innermost_fn as innermost

    return innermost(fn)


def cache_entries(code) -> list:
    """The cache entries (one per compile, newest first) Dynamo keeps on a code object."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

    return _debug_get_cache_entry_list(code)


def resume_codes(code) -> list:
    """The resume functions Dynamo generated from a code object (at its graph breaks)."""
    from torch._dynamo.resume_execution import ContinueExecutionCache

    cache = ContinueExecutionCache.cache
    return list((cache[code] if code in cache else {}).values())
