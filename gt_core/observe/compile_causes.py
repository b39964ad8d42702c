"""The catalogue's causes for the user's own torch.compile calls: recompiles (guard
failures), the recompile limit and budget, graph breaks, cudagraph skips."""

from __future__ import annotations

from gt_core.observe.cause import Cause

__all__ = ["COMPILE_CAUSES"]

_TENSOR_OPS = (
    "keep it in a 0-d tensor (e.g. `self.idx = torch.zeros((), dtype=torch.long)`, advanced "
    "with `self.idx.add_(1)`) and replace the Python branch on it by tensor ops "
    "(`torch.where`, a mask, `index_copy_`): then the graph no longer depends on its value"
)

COMPILE_CAUSES: tuple[Cause, ...] = (
    # -- recompiles: guard failures --------------------------------------------------------
    Cause(
        "int_argument",
        ("recompile",),
        r"^(?P<expr>L\['\w+'\]|\w+)\s*==\s*(?P<value>-?\d+)\b(?!\.)",
        "a guard on the Python int argument `{expr}` failed (it was {value}), so the function "
        "was compiled again",
        "if it takes only a few values, this is expected; if many, pass it as a tensor",
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
        "a guard on a Python int read from mutable state failed: `{expr}` was {value} when the "
        "graph was compiled",
        _TENSOR_OPS,
    ),
    Cause(
        "float_constant",
        ("recompile",),
        r"(?P<expr>\S+)\s*==\s*(?P<value>-?\d+\.\d*(?:e-?\d+)?)",
        "a guard on the Python float `{expr}` failed (it was {value}), so the function was "
        "compiled again (learning rates, schedules, bias corrections)",
        "pass it as a 0-d tensor instead of a Python float",
    ),
    # (what torch did with a value after the recompile, read from its cache entries: see
    # observe.user_compiles; chosen by id)
    Cause(
        "value_made_dynamic",
        ("recompile",),
        None,
        "`{expr}` changed (it was {value}): torch compiled the new graph with it dynamic "
        "(automatic dynamic shapes), so its later values reuse that graph",
        "nothing to do: that one recompile is the whole cost{avoid}",
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
        "size_one",
        ("recompile",),
        r"^2 <= (?P<name>\S+?)\.size\(\)\[(?P<dim>\d+)\]$",
        "input `{name}` has a size of 0 or 1 at dimension {dim}: torch keeps those sizes apart "
        "(a dynamic size is one of 2 or more), so it compiles a graph for that size",
        "expected once per such size; to share one graph, call "
        "`torch._dynamo.decorators.mark_unbacked({name}, {dim})` before the first call (torch "
        "then assumes nothing of that size)",
    ),
    Cause(
        "shape_kept_static",
        ("recompile",),
        None,
        "input `{name}` changed shape: dimension {dim} was {old}, now {new}; torch kept that "
        "dimension static ({graphs} so far): the code needs it as a Python int (a loop count, "
        "`range`, a branch on the size), so each new size needs a graph of its own and "
        "`dynamic=True` would not help",
        "expected if it takes a few sizes (each compiles once); with many, pad inputs to a few "
        "fixed sizes (buckets), or keep the loop or branch on the size outside the compiled "
        "function",
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
        "expected if it runs both ways: each grad mode compiles once and later calls reuse its "
        "graph; to save that recompile, call it under one mode",
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
        "nothing to do: each mode compiles once and later switches reuse its graph",
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
        "the recompile limit ({limit}) was hit: no new graph is compiled for this function; a "
        "call whose inputs pass the guards of one of its cached graphs still runs compiled, "
        "every other call runs eagerly (uncompiled)",
        "fix the cause of its recompiles (above); raising `torch._dynamo.config.recompile_limit` "
        "keeps more graphs, one per new value, so it helps only while the values are few",
    ),
    Cause(
        "recompile_budget",
        ("budget",),
        r"(?P<text>.+)",
        "{text}",
        "fix the cause of the recompiles before the limit is hit: then calls that need a new "
        "graph run eagerly",
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
    # (first: what breaks a graph in a loop is named in the same text)
    Cause(
        "break_in_loop",
        ("graph_break",),
        r"Skipping the function and falling back to eager.*graph break in loop",
        "a graph break inside a `for`/`while` loop: torch cannot resume a graph in a loop, so "
        "it skips the whole function, which runs eagerly (uncompiled) on every call",
        "move what breaks the graph (a `print`, an `.item()`, a call torch cannot trace) out of "
        "the loop, or the loop out of the compiled function",
    ),
    Cause(
        "frame_skipped",
        ("graph_break",),
        r"Skipping the function and falling back to eager",
        "a graph break torch could not resume from: it skips the whole function, which runs "
        "eagerly (uncompiled) on every call",
        "remove the graph break named with it, or move it out of the compiled function",
    ),
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
        "keep the value as a tensor; or, where only tensor ops use it, set "
        "`torch._dynamo.config.capture_scalar_outputs = True` (a Python `if` or loop on it "
        "breaks the graph still)",
    ),
    Cause(
        "item_steers_python",
        ("graph_break",),
        None,
        "a tensor's value decides a Python `if` or loop (`{line}`), which splits the graph "
        "whatever `capture_scalar_outputs` says",
        "compute both sides and pick with `torch.where(cond, a, b)`, or use `torch.cond`; "
        "or move the branch out of the compiled function",
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
)
