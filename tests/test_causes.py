"""The table of known causes: real reason texts of torch 2.13 → cause in words and the fix."""

import pytest

from gt_core import events as ev
from gt_core.observe.causes import (
    CAUSES,
    HOTPATH_KINDS,
    KINDS,
    budget_message,
    explain,
    short_reason,
)
from gt_core.observe.user_compiles import summarize_user_compiles

# Reason texts as torch 2.13 wrote them (CompilationMetrics.recompile_reason, graph-break
# logs, the recompile-limit warning), recorded while building gt_core.diagnostics.
KV_REASON = (
    "0/0: G['cache']._current_idx[0] == 0                               # if cache._current_idx[0] == 0:"
    '  # mp/exp/kv.py:9 in kv_step\nUser stack trace:\n  File "/tmp/exp/kv.py", line 9, in kv_step\n'
    "    if cache._current_idx[0] == 0:"
)
PRINT_BREAK = (
    "Failed to trace builtin operator\n  Explanation: Dynamo does not know how to trace builtin "
    "operator `print` with argument types ['str'] (has_kwargs False)\n  Hint: Avoid calling builtin "
    "`print` with argument types ['str']."
)
ITEM_BREAK = (
    "Unsupported Tensor.item() call with capture_scalar_outputs=False\n  Explanation: Dynamo does "
    "not support tracing `Tensor.item()` with config.capture_scalar_outputs=False."
)
NONZERO_BREAK = (
    "Dynamic shape operator\n  Explanation: Operator `aten.nonzero.default`'s output shape depends "
    "on input Tensor data."
)
SKIPPED_CALL = (
    "Attempted to call function marked as skipped\n  Explanation: Dynamo does not know how to trace "
    "the builtin `<unknown module>.TensorBase._make_wrapper_subclass.`"
)


@pytest.mark.parametrize(
    "kind, reason, cause_id, words",
    [
        ("recompile", KV_REASON, "int_from_mutable_state", "G['cache']._current_idx[0]"),
        (
            "recompile",
            "0/0: L['self'].kv_cache._current_idx[7] == 0",
            "int_from_mutable_state",
            "_current_idx[7]",
        ),
        (
            "recompile",
            "0/0: tensor 'x' size mismatch at index 0. expected 3, actual 5",
            "shape_change",
            "mark_dynamic(x, 0)",
        ),
        (
            "recompile",
            "0/0: tensor 'x' dtype mismatch. expected Float, actual Double",
            "dtype_change",
            "Float → Double",
        ),
        (
            "recompile",
            "0/0: tensor 'x' requires_grad mismatch. expected requires_grad=0",
            "requires_grad_change",
            "`x`",
        ),
        (
            "recompile",
            "0/0: GLOBAL_STATE changed: grad_mode ",
            "grad_mode_change",
            "torch.no_grad()",
        ),
        (
            "recompile",
            "0/0: n == 2      # def f(x, n): return x * n  # f.py:26 in f",
            "int_argument",
            "`n`",
        ),
        ("recompile", "0/0: v == 0.5    # def f(x, v): ...", "float_constant", "0-d tensor"),
        ("recompile", "0/0: s == 'a'    # ...", "constant_value", "'a'"),
        ("recompile", "0/0: len(L['xs']) == 3", "length_change", "L['xs']"),
        ("recompile", "0/0: L['self'].training == True", "train_eval_switch", "train()"),
        (
            "recompile",
            "0/0: ___check_obj_id(L['fn'], 1402), type=<class 'function'>",
            "object_identity",
            "L['fn']",
        ),
        ("graph_break", PRINT_BREAK, "print", "print"),
        ("graph_break", ITEM_BREAK, "item", "capture_scalar_outputs"),
        ("graph_break", NONZERO_BREAK, "data_dependent_shape", "capture_dynamic_output_shape_ops"),
        ("graph_break", SKIPPED_CALL, "untraceable_call", "custom_op"),
        ("limit_hit", "torch._dynamo hit config.recompile_limit (8)", "recompile_limit", "(8)"),
        (
            "cudagraph_skip",
            "skipping cudagraphs due to mutated inputs (8 instances)",
            "mutated_inputs",
            "in place",
        ),
        ("cudagraph_skip", "cudagraphs skipped 1 time(s), no reason logged", "cpu_device", "CPU"),
        (
            "failure",
            "Detected recompile when torch.compile stance is 'fail_on_recompile'.",
            "fail_on_recompile",
            "stance",
        ),
        (
            "budget",
            "kv_step: 6 of the 8 graphs `recompile_limit` allows compiled",
            "recompile_budget",
            "6 of the 8",
        ),
        ("failure", "Unsupported: Failed to trace builtin operator", "fullgraph", "fullgraph=True"),
    ],
)
def test_known_causes_are_explained_with_a_fix(kind, reason, cause_id, words):
    x = explain(kind, reason)
    assert x["id"] == cause_id
    assert words in x["cause"] + x["fix"]
    assert x["fix"] and "{" not in x["cause"] + x["fix"]  # every placeholder filled


def test_unknown_reason_is_shown_raw_with_the_general_fix():
    x = explain("recompile", "0/0: some_new_guard(L['q']) is odd  # f.py:3")
    assert x["id"] == "unknown"
    assert x["cause"] == "some_new_guard(L['q']) is odd"
    assert x["fix"]
    assert explain("graph_break", "Brand new break\n  Explanation: nobody knows")["cause"] == (
        "Brand new break: nobody knows"
    )


def test_short_reason_keeps_the_guard_or_the_break_type_and_explanation():
    assert short_reason(KV_REASON) == "G['cache']._current_idx[0] == 0"
    assert short_reason(PRINT_BREAK).startswith("Failed to trace builtin operator: Dynamo does not")
    logged = (
        "Graph break in user code at f.py:3\nGraph Break Reason: Encountered graph break when "
        "attempting to trace CALL: a function call, e.g. f(x, y):\n\n" + PRINT_BREAK
    )
    assert short_reason(logged) == short_reason(PRINT_BREAK)


def test_budget_message_counts_down_to_the_fallback():
    """The limit counts graphs (cache entries), the first compile's included: 6 graphs are
    5 recompiles, so the message counts graphs, not recompiles."""
    assert budget_message("kv_step", 6, 8).startswith(
        "kv_step: 6 of the 8 graphs `recompile_limit` allows compiled"
    )
    assert "2 more" in budget_message("kv_step", 6, 8)
    assert "the next recompile hits the limit" in budget_message("kv_step", 8, 8)
    hit = budget_message("kv_step", 8, 8, hit=True)
    assert (
        hit.startswith("kv_step: 8 of the 8") and "calls that need a new graph run eagerly" in hit
    )
    assert "from now on" not in hit  # (cached graphs still run: see test_diagnostics)


def _budget_events(limit_hit: bool) -> list[dict]:
    """What the watcher publishes for kv_step with recompile_limit=8: budget warnings from
    6 of 8 on, then (when ``limit_hit``) the limit hit on the call after the 8th compile."""
    out = []
    for used in range(1, 9):
        out.append(ev.event(ev.USER_COMPILE, function="kv_step", compile_id=f"0/{used - 1}"))
        if used >= 6:
            out.append(
                ev.event(
                    ev.USER_BUDGET,
                    function="kv_step",
                    used=used,
                    limit=8,
                    message=budget_message("kv_step", used, 8),
                )
            )
    if limit_hit:
        out.append(
            ev.event(
                ev.USER_LIMIT_HIT,
                function="kv_step",
                limit=8,
                limit_type="recompile_limit",
                reason="hit config.recompile_limit (8): kv_step compiles no new graph; calls "
                "that need one run eagerly",
            )
        )
    return out


def test_budget_warns_while_recompiles_are_left():
    (u,) = summarize_user_compiles(_budget_events(limit_hit=False))
    (x,) = [x for x in u["explanations"] if x["kind"] == "budget"]
    assert x["cause"] == (
        "kv_step: 8 of the 8 graphs `recompile_limit` allows compiled (the next recompile hits "
        "the limit: calls that need a new graph then run eagerly)"
    )
    assert u["budget"]["used"] == 8 and not u["limit_hit"]


def test_after_the_limit_hit_no_row_says_the_fallback_is_still_ahead():
    (u,) = summarize_user_compiles(_budget_events(limit_hit=True))
    assert u["limit_hit"] and u["limit"] == 8
    kinds = [x["kind"] for x in u["explanations"]]
    assert kinds == ["limit_hit"]  # the limit hit says it all; the budget row would contradict it
    assert "still runs compiled, every other call runs eagerly" in u["explanations"][0]["cause"]
    assert "the next recompile" not in str(u)
    assert u["budget"]["message"].startswith(
        "kv_step: 8 of the 8 graphs `recompile_limit` allows compiled, then the limit"
    )


def test_the_table_is_consistent():
    ids = [c.id for c in CAUSES]
    assert len(ids) == len(set(ids))
    for c in CAUSES:
        assert c.kinds and set(c.kinds) <= set(KINDS) | set(HOTPATH_KINDS), c.id
        assert c.cause and c.fix, c.id
    for kind in (*KINDS, *HOTPATH_KINDS):  # every kind has a fix for reasons nobody listed
        assert explain(kind, "zzz unheard of")["fix"]


def test_routed_cause_names_the_function():
    x = explain("routed", "", fn="step")
    assert x["cause"].startswith("torch.compile(step) was called with worker tensors")


def test_the_dashboard_reads_gt_s_own_advice_from_the_one_catalogue():
    from gt_jupyter import _tables  # noqa: PLC0415

    kinds = {k for c in CAUSES for k in c.kinds}
    assert set(HOTPATH_KINDS) <= kinds
    assert not [n for n in vars(_tables) if n.endswith("_ADVICE")]  # no second catalogue
    change = {"kind": "batch_size", "old": 32, "new": 31}  # (observe.graph.Change's data)
    assert _tables.recompile_advice(change).startswith("the batch size changed (32 → 31): ")
    assert "drop_last=True" in _tables.recompile_advice(change)
    assert _tables.recompile_advice(None) == explain("signature_change", "same form")["fix"]


def test_a_signature_change_is_typed_where_it_is_found_and_never_read_back():
    """The advice for a recompile of gt's own block is chosen by the change's kind, which
    observe.graph.change gives from the two signatures' data; no cause matches its words."""
    from gt_core.observe.graph import change  # noqa: PLC0415

    def data(sig, shape, dtype="torch.float32", args=(1.0,)):
        op = {"kind": "op", "op": "aten.mul.Tensor", "args": ["%in0", *args], "kwargs": {}}
        inp = {"name": "in0", "shape": shape, "dtype": dtype, "device": "cpu", "stride": [1]}
        return {"signature": sig, "entries": [op], "inputs": [inp]}

    assert change(data("a", [32, 8]), data("b", [31, 8])).kind == "batch_size"
    assert change(data("a", [32, 8]), data("b", [32, 9])).kind == "input_shape"
    assert change(data("a", [4]), data("b", [4], "torch.float64")).kind == "input_dtype"
    assert change(data("a", [4]), data("b", [4], args=(2.0,))).kind == "python_number"
    assert change(data("a", [4]), data("a", [4])) is None
    c = change(data("a", [32, 8]), data("b", [31, 8]))
    assert (c.old, c.new) == (32, 31) and "[32, 8] → [31, 8]" in c.text
    assert explain("signature_change", c.text)["id"] == "unknown"  # (words are not read)
