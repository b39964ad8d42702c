"""Every private torch API that gt_core.diagnostics relies on, in one place (torch 2.13).

None of these is a stable interface: a torch release may rename or drop any of them. Each
is reached only through this module, so that an upgrade is checked here; callers treat a
missing one as a source that this torch lacks (a ``user.failure`` event naming it), never as
an error in the user's code. Torch is imported where a function needs it: the package's
import stays light.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Callable

__all__ = [
    "GRAPH_BREAK_LOG",
    "LIMIT_LOG",
    "TENSOR_LOG",
    "CUDAGRAPH_LOG",
    "RESUME",
    "artifact_enabled",
    "cache_entries",
    "call_parts",
    "compilation_metrics",
    "compiled_fn_of",
    "counted_cudagraph_skips",
    "current_compile_id",
    "disable_current_modes",
    "first_failure",
    "global_state_now",
    "guard_children",
    "guard_scope",
    "hook_recompile_check",
    "hook_compilation_event",
    "hook_compile_phases",
    "hook_guard_complete",
    "hook_compiled_graphs",
    "is_call_wrapper",
    "in_backward",
    "innermost_fn",
    "is_module_wrapper",
    "leaf_guards",
    "leaf_passes",
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


def hook_compile_phases(on_start: Callable[[str], None], on_end: Callable[[str], None]):
    """Call ``on_start(name)`` and ``on_end(name)`` where each phase Dynamo times begins and
    ends (``dynamo_timed`` tells its chromium event logger, on the compiling thread: the
    names are its keys, ``dynamo``, ``bytecode_tracing``, ``backend_compile``...); returns
    the undo.

    Raises ``AttributeError`` where this torch has no ``get_chromium_event_logger``.
    """
    logger = _dynamo_utils().get_chromium_event_logger()
    start, end = logger.log_event_start, logger.log_event_end

    def log_event_start(event_name, *args, **kwargs):
        with contextlib.suppress(Exception):  # (a diagnostics bug never breaks a compile)
            on_start(event_name)
        return start(event_name, *args, **kwargs)

    def log_event_end(event_name, *args, **kwargs):
        with contextlib.suppress(Exception):
            on_end(event_name)
        return end(event_name, *args, **kwargs)

    logger.log_event_start, logger.log_event_end = log_event_start, log_event_end

    def undo():
        for name in ("log_event_start", "log_event_end"):
            logger.__dict__.pop(name, None)  # (the class's methods show again)

    return undo


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


def call_parts(frame) -> tuple[list | None, tuple, dict]:
    """From the frame of Dynamo's wrapper that asked ``_callback_from_stance`` (its locals,
    read once): the list of callables it calls as the compiled function's call ends (its
    ``cleanups``, run in its ``finally``; None where the frame has none, a ``with`` block),
    and the call's positional and keyword arguments."""
    f_locals = frame.f_locals
    cleanups = f_locals.get("cleanups")
    args, kwargs = f_locals.get("args") or (), f_locals.get("kwargs") or {}
    return (cleanups if type(cleanups) is list else None), tuple(args), dict(kwargs)


def hook_guard_complete(on_result: Callable[[bool, object], None]) -> Callable[[], None]:
    """Call ``on_result(hit, caller)`` each time Dynamo has checked a frame's guards against
    its cache entries (True: an entry fits and its compiled code runs; False: none fits, so
    the frame compiles, or past the recompile limit runs eagerly); ``caller``: the Python
    frame that called the checked one (Dynamo's wrapper for a compiled function's own frame,
    the user's frame at a graph break's line for a resume function); returns the undo. A
    frame with no entry yet is not checked. A hook already set (guard collectives) keeps its
    say.

    Raises ``ImportError`` where this torch has no ``set_guard_complete_hook``.
    """
    from torch._C._dynamo.eval_frame import set_guard_complete_hook

    previous = None

    def guard_complete(hit: bool) -> bool:
        if previous is not None:
            hit = previous(hit)
        on_result(bool(hit), sys._getframe(1))
        return hit

    previous = set_guard_complete_hook(guard_complete)

    def undo():
        current = set_guard_complete_hook(previous)
        if current is not guard_complete:  # (another hook went in after ours: it stays)
            set_guard_complete_hook(current)

    return undo


def is_call_wrapper(frame) -> bool:
    """Whether ``frame`` is Dynamo's wrapper around a call of a compiled function."""
    return frame.f_code.co_filename.replace("\\", "/").endswith("_dynamo/eval_frame.py")


def hook_compiled_graphs(wrap: Callable) -> Callable[[], None]:
    """Pass each graph a backend compiles (what ``OutputGraph.call_user_compiler`` returns
    to Dynamo, which calls it with the graph's inputs) through ``wrap(fn)``, whose result
    Dynamo installs in its place; returns the undo. A graph wrapped stays wrapped after it.

    Raises ``AttributeError`` where this torch has no ``OutputGraph.call_user_compiler``.
    """
    from torch._dynamo.output_graph import OutputGraph

    original = OutputGraph.call_user_compiler

    def call_user_compiler(self, gm, example_inputs):
        return wrap(original(self, gm, example_inputs))

    OutputGraph.call_user_compiler = call_user_compiler
    return lambda: setattr(OutputGraph, "call_user_compiler", original)


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


# -- every failing guard of a recompile ---------------------------------------------------
def hook_recompile_check(on_check: Callable) -> Callable[[], None]:
    """Call ``on_check(cache_entries, frame)`` where Dynamo asks why a call misses its cache
    entries, before it answers (``frame.f_locals`` are the new call's, the global state is
    the caller's); returns the undo.

    Raises ``AttributeError`` where this torch has no
    ``convert_frame.get_and_maybe_log_recompilation_reasons``.
    """
    from torch._dynamo import convert_frame

    original = convert_frame.get_and_maybe_log_recompilation_reasons

    def get_and_maybe_log_recompilation_reasons(cache_entries, frame, *args, **kwargs):
        on_check(cache_entries, frame)
        return original(cache_entries, frame, *args, **kwargs)

    convert_frame.get_and_maybe_log_recompilation_reasons = get_and_maybe_log_recompilation_reasons
    return lambda: setattr(convert_frame, "get_and_maybe_log_recompilation_reasons", original)


def guard_scope(entry, f_locals: dict):
    """(root guard manager, globals, locals) to walk a cache entry's guards against a call's
    locals: a guard manager's source (``L['x']``, ``G['cfg'].n``) evaluates in that scope, as
    Dynamo evaluates its own guard code. None where the entry's guards were deleted."""
    wrapper = entry.guard_manager
    root = getattr(wrapper, "root", None)
    if root is None or wrapper.global_scope is None:
        return None
    scope = {"L": f_locals, "G": wrapper.global_scope["G"], **(wrapper.closure_vars or {})}
    return root, dict(wrapper.global_scope), scope


def guard_children(manager) -> list[tuple[str, object]]:
    """(source, child guard manager) of each value a guard manager reads from its own."""
    return [(child.get_source(), child) for child in manager.get_child_managers()]


def leaf_guards(manager, root: bool = False) -> list[tuple[str, object, list[str]]]:
    """(kind, leaf guard, its code parts) of a guard manager's own checks; the root's
    epilogue guards (the shape guards, checked last) with them."""
    leaves = list(manager.get_leaf_guards())
    if root and hasattr(manager, "get_epilogue_lambda_guards"):
        leaves += list(manager.get_epilogue_lambda_guards())
    return [(type(g).__name__, g, list(g.verbose_code_parts())) for g in leaves]


def leaf_passes(leaf, value) -> bool | None:
    """Whether one leaf guard passes on ``value``; None where it cannot be checked alone (a
    guard relating two values, such as tensor aliasing)."""
    try:
        return bool(leaf(value))
    except TypeError:
        return None


def first_failure(entry, f_locals: dict) -> tuple[list[str], list[tuple[str, int, str]]]:
    """The first failing guard of a cache entry on a call's locals, as Dynamo's verbose
    recompile log names it: its code parts, and the user stack torch recorded where the
    guarded value was read, outermost first, each ``(file, line, source)`` ([] if none)."""
    info = entry.guard_manager.check_verbose(f_locals)
    stack = [(f.filename, f.lineno, (f.line or "").strip()) for f in (info.user_stack or ())]
    return list(info.verbose_code_parts), stack


def global_state_now() -> str:
    """The global state Dynamo guards (grad mode, autocast, default dtype...), as the JSON
    its ``GLOBAL_STATE`` guard records."""
    from torch._C._dynamo.guards import GlobalStateGuard

    return GlobalStateGuard().__getstate__()
