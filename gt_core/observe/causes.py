"""Known causes of recompiles, graph breaks and cudagraph skips: what each means, what to do.

One table, :data:`CAUSES`. :func:`explain` finds the first cause whose pattern matches a
reason that Dynamo or Inductor gave, and returns the cause in words with the usual fix.
Unknown reasons come back as they are, with the general advice for their kind. Pure
functions of strings: no torch import (the dashboard and offline logs use them too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "CAUSES",
    "Cause",
    "explain",
    "budget_message",
    "short_reason",
    "KINDS",
    "HOTPATH_KINDS",
]

# The kinds of diagnostics a reason can come from (the ``user.*`` event that carried it).
KINDS = ("recompile", "graph_break", "limit_hit", "cudagraph_skip", "failure", "budget", "routed")
# The kinds of gt's own reasons (its hot paths), as the dashboard's reasons table lists them.
HOTPATH_KINDS = (
    "signature_change",
    "revert",
    "compile_failed",
    "sync",
    "mismatch",
    "jit_refused",
    "jit_frozen",
    "jit_would_save",
    "worker_error",
)


@dataclass(frozen=True)
class Cause:
    """One known cause: where it occurs, how to recognise it, what it means and what to do.

    ``cause`` and ``fix`` are format strings over the pattern's named groups.
    """

    id: str
    kinds: tuple[str, ...]
    pattern: str
    cause: str
    fix: str

    def match(self, kind: str, reason: str) -> dict | None:
        if kind not in self.kinds:
            return None
        m = re.search(self.pattern, reason, re.S)
        return None if m is None else {k: v or "" for k, v in m.groupdict().items()}


_TENSOR_OPS = (
    "keep it in a 0-d tensor (e.g. `self.idx = torch.zeros((), dtype=torch.long)`, advanced "
    "with `self.idx.add_(1)`) and replace the Python branch on it by tensor ops "
    "(`torch.where`, a mask, `index_copy_`): then the graph no longer depends on its value"
)

CAUSES: tuple[Cause, ...] = (
    # -- recompiles: guard failures --------------------------------------------------------
    Cause(
        "int_argument",
        ("recompile",),
        r"^(?P<expr>L\['\w+'\]|\w+)\s*==\s*(?P<value>-?\d+)\b(?!\.)",
        "a guard on the Python int argument `{expr}` (it was {value}): a new value compiles "
        "a new graph",
        "pass it as a tensor, or mark it dynamic (`torch.compile(..., dynamic=True)`); if it "
        "takes only a few values, this is expected and stops after each value was seen once",
    ),
    Cause(
        "length_change",
        ("recompile",),
        r"len\((?P<expr>[^)]+)\)\s*==\s*(?P<value>\d+)",
        "the length of `{expr}` changed (it was {value})",
        "pass a tensor, or a container of fixed length",
    ),
    Cause(
        "int_from_mutable_state",
        ("recompile",),
        r"(?P<expr>\S*(?:\.|\[)\S*)\s*==\s*(?P<value>-?\d+)\b(?!\.)",
        "a guard on a Python int read from mutable state: `{expr}` was {value} when the graph "
        "was compiled, and every new value compiles a new graph",
        _TENSOR_OPS,
    ),
    Cause(
        "float_constant",
        ("recompile",),
        r"(?P<expr>\S+)\s*==\s*(?P<value>-?\d+\.\d*(?:e-?\d+)?)",
        "a guard on the Python float `{expr}` (it was {value}): each new value compiles a new "
        "graph (learning rates, schedules, bias corrections)",
        "pass it as a 0-d tensor instead of a Python float, or set "
        "`torch._dynamo.config.specialize_float = False`",
    ),
    Cause(
        "shape_change",
        ("recompile",),
        r"tensor '(?P<name>[^']+)' size mismatch at index (?P<dim>\d+)\. "
        r"expected (?P<old>\d+), actual (?P<new>\d+)",
        "input `{name}` changed shape: dimension {dim} was {old}, now {new}",
        "compile with `dynamic=True`, or call `torch._dynamo.mark_dynamic({name}, {dim})` before "
        "the first call; or pad inputs to a few fixed sizes (buckets)",
    ),
    Cause(
        "stride_change",
        ("recompile",),
        r"tensor '(?P<name>[^']+)' stride mismatch",
        "input `{name}` changed strides (a transposed, sliced or non-contiguous tensor)",
        "pass `{name}.contiguous()`, or build it the same way on every call",
    ),
    Cause(
        "dtype_change",
        ("recompile",),
        r"tensor '(?P<name>[^']+)' dtype mismatch\. expected (?P<old>\w+), actual (?P<new>\w+)",
        "input `{name}` changed dtype: {old} → {new}",
        "cast inputs to one dtype before the call",
    ),
    Cause(
        "device_change",
        ("recompile",),
        r"tensor '(?P<name>[^']+)' (?:device|dispatch key set) mismatch",
        "input `{name}` moved to another device (or changed its dispatch keys)",
        "keep the inputs of one compiled function on one device",
    ),
    Cause(
        "requires_grad_change",
        ("recompile",),
        r"tensor '(?P<name>[^']+)' requires_grad mismatch",
        "input `{name}` changed requires_grad",
        "pass it the same way every call: `.detach()` it, or set requires_grad once",
    ),
    Cause(
        "grad_mode_change",
        ("recompile",),
        r"GLOBAL_STATE changed: grad_mode",
        "grad mode changed: the function was called both under `torch.no_grad()` and outside",
        "compile one function for training and one for inference, or call it under one mode",
    ),
    Cause(
        "global_state_change",
        ("recompile",),
        r"GLOBAL_STATE changed: (?P<what>\w+)",
        "global torch state changed between calls ({what})",
        "set that state once outside the loop (autocast, default dtype, determinism, threads)",
    ),
    Cause(
        "train_eval_switch",
        ("recompile",),
        r"(?P<expr>\S+)\.training\s*==\s*(?P<value>True|False)",
        "a module switched between train() and eval() (`{expr}.training` was {value})",
        "expected once per mode; compile separate functions for training and evaluation",
    ),
    Cause(
        "object_identity",
        ("recompile",),
        r"___check_obj_id\((?P<expr>[^,]+),|ID_MATCH",
        "the identity of an object changed (`{expr}`): a new module, function or object each call",
        "create it once outside the loop and reuse it; don't rebuild modules or lambdas per call",
    ),
    Cause(
        "type_change",
        ("recompile",),
        r"___check_type_id\((?P<expr>[^,]+),|TYPE_MATCH",
        "the type of `{expr}` changed between calls",
        "pass values of the same type every call",
    ),
    Cause(
        "constant_value",
        ("recompile",),
        r"(?P<expr>\S+)\s*==\s*(?P<value>'[^']*'|\"[^\"]*\"|True|False|None)",
        "a guard on the constant `{expr}` (it was {value}): each distinct value has its own graph",
        "expected when it takes few values; otherwise pass the value as a tensor",
    ),
    # -- the recompile limit, the budget, strict stances -----------------------------------
    Cause(
        "recompile_limit",
        ("limit_hit",),
        r"^(?:.*?(?P<limit_type>\w*limit)\s*\((?P<limit>\d+)\))?",
        "the recompile limit ({limit}) was hit: this function runs eagerly (uncompiled) from "
        "now on",
        "fix the cause of its recompiles (above); raising `torch._dynamo.config.recompile_limit` "
        "only delays the fallback",
    ),
    Cause(
        "recompile_budget",
        ("budget",),
        r"(?P<text>.+)",
        "{text}",
        "fix the cause of the recompiles before the limit is hit: then it runs eagerly",
    ),
    Cause(
        "fail_on_recompile",
        ("failure",),
        r"fail_on_recompile|RecompileError|Recompiling function|error_on_recompile",
        "a recompile was made an error (`set_stance('fail_on_recompile')` or "
        "`torch._dynamo.config.error_on_recompile`)",
        "the guard failure in the message names the cause; fix it, or leave that stance",
    ),
    Cause(
        "fullgraph",
        ("failure",),
        r"^Unsupported: |fullgraph=True",
        "with fullgraph=True a graph break is an error, so the call raised",
        "remove the graph break named with it, or compile without fullgraph=True",
    ),
    Cause(
        "api_unavailable",
        ("failure",),
        r"unavailable: (?P<what>.+)",
        "a diagnostics hook is unavailable in this torch version ({what})",
        "gt shows less for this torch version; the compiled function itself is unaffected",
    ),
    Cause(
        "routed",
        ("routed",),
        r"",
        "torch.compile({fn}) was called with worker tensors: Dynamo does not trace them; its ops "
        "ran through gt's hot path instead",
        "nothing to do (gt compiles the hot path); run the cell with `%%gt --local` to debug "
        "this function's own torch.compile",
    ),
    # -- graph breaks ---------------------------------------------------------------------
    Cause(
        "print",
        ("graph_break",),
        r"builtin operator `print`|print\(",
        "`print` inside the compiled function splits the graph",
        "move the print out of the compiled function (print its results after the call), or "
        "`torch._dynamo.config.reorderable_logging_functions.add(print)`",
    ),
    Cause(
        "item",
        ("graph_break",),
        r"Tensor\.item\(\)|\.item\(\)|capture_scalar_outputs",
        "`.item()` reads a tensor's value into Python, which splits the graph",
        "keep the value as a tensor; or set `torch._dynamo.config.capture_scalar_outputs = True`",
    ),
    Cause(
        "data_dependent_shape",
        ("graph_break",),
        r"Dynamic shape operator|output shape depends on|capture_dynamic_output_shape_ops",
        "an op whose output shape depends on the data (nonzero, unique, boolean masks)",
        "use fixed-shape alternatives (`torch.where`, multiply by a mask), or set "
        "`torch._dynamo.config.capture_dynamic_output_shape_ops = True`",
    ),
    Cause(
        "data_dependent_branch",
        ("graph_break",),
        r"[Dd]ata-dependent (?:branching|jump)|generic_jump|jump.*[Tt]ensor",
        "a Python `if` on a tensor's value",
        "replace the branch by `torch.where` (both sides computed) or `torch.cond`",
    ),
    Cause(
        "to_python",
        ("graph_break",),
        r"\.numpy\(\)|\.tolist\(\)|Tensor\.(?:numpy|tolist)",
        "the tensor is converted to NumPy or Python inside the compiled function",
        "keep the computation in torch, or convert after the call",
    ),
    Cause(
        "explicit_break",
        ("graph_break",),
        r"graph_break\(\)|Call to `torch._dynamo.graph_break\(\)`",
        "an explicit `torch._dynamo.graph_break()`",
        "remove it once you no longer need the split",
    ),
    Cause(
        "untraceable_call",
        ("graph_break",),
        r"marked as skipped|Failed to trace builtin|does not know how to trace|"
        r"unsupported (?:builtin|call|function)|C extension",
        "a call Dynamo cannot trace (a builtin, a C extension or a skipped function)",
        "move it out of the compiled function, or wrap it as a custom op "
        "(`torch.library.custom_op`) or with `torch.compiler.allow_in_graph`",
    ),
    # -- cudagraph skips ------------------------------------------------------------------
    Cause(
        "mutated_inputs",
        ("cudagraph_skip",),
        r"mutated inputs|mutation",
        "the compiled function mutates an input in place, so CUDA graphs are skipped",
        "return new tensors instead of mutating inputs (`x = x + y`, not `x.add_(y)`), or move "
        "the in-place update out of the compiled function",
    ),
    Cause(
        "cpu_device",
        ("cudagraph_skip",),
        r"cpu device|non.?(?:cuda|gpu)|no reason logged",
        "CUDA graphs apply only to CUDA tensors: on CPU mode='reduce-overhead' skips them",
        "use the default mode on CPU; reduce-overhead pays off on a GPU",
    ),
    Cause(
        "dynamic_shapes",
        ("cudagraph_skip",),
        r"dynamic shape|symbolic",
        "CUDA graphs were skipped for a graph with dynamic shapes",
        "keep shapes static (pad to fixed sizes), or mark the dimension static",
    ),
    Cause(
        "incompatible_ops",
        ("cudagraph_skip",),
        r"incompatible op|cpu op|non.?gpu op|CPU tensor",
        "an op in the graph cannot be captured in a CUDA graph (a CPU op or a sync)",
        "move that op out of the compiled function, or keep its tensors on the GPU",
    ),
    # -- gt's own hot paths: what the dashboard's reasons table says to do ----------------
    # A recompile: the first difference between two signatures (gt_core.stream.canonical.diff).
    Cause(
        "batch_size",
        ("signature_change",),
        r"shape \[(?P<old>\d+)(?P<rest>(?:, \d+)*)\] → \[(?!(?P=old)[,\]])(?P<new>\d+)(?P=rest)\]",
        "the batch size changed ({old} → {new})",
        "use a fixed batch size (DataLoader(..., drop_last=True)) or --dynamic",
    ),
    Cause(
        "input_shape",
        ("signature_change",),
        r" shape ",
        "an input shape changed",
        "pad or bucket to a few fixed shapes, or --dynamic",
    ),
    Cause(
        "input_dtype",
        ("signature_change",),
        r" dtype ",
        "an input dtype changed",
        "cast once before the loop and use autocast the same way every step",
    ),
    Cause(
        "input_stride",
        ("signature_change",),
        r" stride ",
        "an input's memory layout changed (a transposed or sliced tensor)",
        "call .contiguous() on it",
    ),
    Cause(
        "input_device",
        ("signature_change",),
        r" device ",
        "an input moved to another device",
        "move the model and data once, before the loop",
    ),
    Cause(
        "python_number",
        ("signature_change",),
        r"arguments",
        "a Python number changed between iterations (a step counter, a learning-rate schedule)",
        "pass it as a tensor (torch.tensor(lr)), or use the optimizer's capturable=True",
    ),
    Cause(
        "kept_value",
        ("signature_change",),
        r"freed",
        "a value is kept in one iteration and not the next (e.g. losses.append(loss))",
        "keep what the loop holds on to the same every step (losses.append(loss.item()))",
    ),
    Cause(
        "different_work",
        ("signature_change",),
        r"instructions|op \d+: \S+ → \S+",
        "the loop did different work (a Python branch, e.g. every N steps)",
        "move the branch out of the loop, or accept one compiled variant per branch",
    ),
    # One advice per kind, whatever the reason's text.
    Cause(
        "revert",
        ("revert",),
        r"",
        "the compiled block was slower than eager",
        "the compiled block was slower than eager, so gt runs it eagerly again. Small blocks "
        "are launch-bound: try a larger batch, or --backend aot_eager, or --mode "
        "reduce-overhead on a GPU (CUDA graphs)",
    ),
    Cause(
        "compile_failed",
        ("compile_failed",),
        r"",
        "the compile, or a compiled run, failed",
        "the block runs eagerly (correct, not faster). Try --backend aot_eager to see whether "
        "the inductor backend is at fault, or --backend eager to check the capture itself; to "
        "report it, attach an instruction log (--log PATH) and this reason",
    ),
    Cause(
        "sync_cut",
        ("sync",),
        r"",
        "a sync point (.item(), print, .cpu()) cut occurrences short",
        "those occurrences ran eagerly (correct, not faster). Once at the end of a loop or "
        "now and then for logging costs little; a sync in every iteration keeps the block "
        "from running compiled: log every k steps, or keep running values on the worker and "
        "read them once",
    ),
    Cause(
        "diverged",
        ("mismatch",),
        r"",
        "occurrences diverged from the block",
        "the loop body changed part-way through a block (a data-dependent branch or a sync "
        "such as .item()); those occurrences ran eagerly. Keep every iteration's work the "
        "same",
    ),
    Cause(
        "jit_refused",
        ("jit_refused",),
        r"",
        "gt_core.jit does not replay this function",
        "the function keeps running its Python (its block still compiles); to replay it, keep "
        "syncs out of the step and pass changing numbers as tensors (lr=torch.tensor(...), "
        "capturable=True)",
    ),
    Cause(
        "jit_frozen",
        ("jit_frozen",),
        r"",
        "a replay keeps Python numbers as recorded",
        "nothing, if these stay as they are; a number you change later (a learning rate) must "
        "be a tensor the step reads, or replays keep the old value",
    ),
    Cause(
        "jit_would_save",
        ("jit_would_save",),
        r"",
        "the step's Python costs more on the client than its block on the worker",
        "wrap the step in @gt_core.jit: once two calls recorded the same block, a call sends "
        "one message instead of running its Python (see the 05_jit notebook and its contract)",
    ),
    Cause(
        "worker_error",
        ("worker_error",),
        r"",
        "an op raised on the worker",
        "raised in the cell at the first sync after it (or at the cell's end); the values "
        "this op was to make, and those computed from them, do not exist: fix that line and "
        "re-run",
    ),
)

# What to do when no known cause matched: the general advice for each kind.
_BY_ID = {c.id: c for c in CAUSES}
GENERAL_FIX = {
    "recompile": "find the value in the guard that changes between calls and keep it fixed, "
    "or pass it as a tensor",
    "graph_break": "move the line out of the compiled function, or rewrite it with torch ops",
    "limit_hit": _BY_ID["recompile_limit"].fix,
    "cudagraph_skip": "remove the reason named above from the compiled function",
    "failure": "read the message; the compiled function may run eagerly",
    "budget": _BY_ID["recompile_budget"].fix,
    "routed": _BY_ID["routed"].fix,
    "signature_change": "run %gt diff on the two signatures to see where they differ",
}


def short_reason(reason: str) -> str:
    """The part of a Dynamo reason worth a table cell: guard, or gb type and explanation.

    ``"0/3: G['c'].i[0] == 3   # if c.i[0] == 0:  # f.py:9 in step\\nUser stack..."`` →
    ``"G['c'].i[0] == 3"``.
    """
    text = reason.strip()
    text = re.sub(r"^\d+/\d+: ", "", text)
    first = text.split("\n", 1)[0]
    if "Graph Break Reason:" in text or "\n  Explanation:" in text:
        body = text.split("Graph Break Reason:", 1)[-1]
        lines = [ln.strip() for ln in body.split("\n") if ln.strip()]
        lines = [ln for ln in lines if not ln.startswith("Encountered graph break")]
        gb_type = lines[0] if lines else first
        expl = next(
            (ln[len("Explanation:") :].strip() for ln in lines if ln.startswith("Explanation:")), ""
        )
        return f"{gb_type}: {expl}" if expl else gb_type
    return re.sub(r"\s+#.*$", "", first).strip() or first


def explain(kind: str, reason: str, **context) -> dict:
    """``{"id", "cause", "fix"}`` for a reason of ``kind`` (one of :data:`KINDS`).

    ``context`` fills placeholders that come from the event rather than the text (``fn``).
    An unknown reason keeps its own text as the cause, with the general fix of its kind.
    """
    text = str(reason or "")
    guard = short_reason(text) if kind == "recompile" else text
    for c in CAUSES:
        groups = c.match(kind, guard)
        if groups is None and guard != text:
            groups = c.match(kind, text)
        if groups is not None:
            fill = {k: v for k, v in groups.items() if v}
            fill.update({k: str(v) for k, v in context.items() if v is not None})
            return {"id": c.id, "cause": _format(c.cause, fill), "fix": _format(c.fix, fill)}
    return {"id": "unknown", "cause": short_reason(text) or kind, "fix": GENERAL_FIX.get(kind, "")}


def budget_message(function: str, used: int, limit: int, hit: bool = False) -> str:
    """``"kv_step: 6 of 8 recompiles used"`` and what happens at the limit (``hit``: it did)."""
    if hit:
        return (
            f"{function}: {used} of {limit} recompiles used, then the limit was hit: it runs "
            "eagerly from now on"
        )
    left = limit - used
    then = "the next recompile" if left <= 0 else f"{left} more and the next"
    return f"{function}: {used} of {limit} recompiles used ({then} makes it run eagerly)"


def _format(template: str, fill: dict) -> str:
    class _Keep(dict):
        def __missing__(self, key):  # a placeholder the pattern did not capture
            return "?"

    return template.format_map(_Keep(fill))
