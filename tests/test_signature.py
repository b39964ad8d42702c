"""Signature properties, graph export and diffs in words."""

import torch

from gt_core.observe.graph import diff, diff_text, to_networkx
from gt_core.stream.canonical import canonicalize
from gt_core.stream.instructions import FREE, OP, Free, Op, Ref
from gt_core.stream.meta import ValueMeta

F32 = ValueMeta((8, 8), (8, 1), torch.float32, torch.device("cpu"))
F32_B = ValueMeta((4, 8), (8, 1), torch.float32, torch.device("cpu"))
NAMES = {0: "aten.relu.default", 1: "aten.add.Tensor", 2: "aten.mul.Tensor", 3: "aten.gelu.default"}


def canon(instrs, meta=None):
    meta = meta or {}
    return canonicalize(instrs, lambda vid: meta.get(vid, F32), NAMES.__getitem__)[0]


def op(idx, *ins, out):
    return Op(OP, idx, tuple(Ref(i) for i in ins), {}, (out,))


def test_renamed_ids_give_the_same_signature():
    a = canon([op(0, 1, out=2), op(1, 2, 1, out=3), Free(FREE, 2)])
    b = canon([op(0, 71, out=90), op(1, 90, 71, out=91), Free(FREE, 90)])
    assert a.id == b.id and len(a.id) == 12


def test_different_dependencies_give_different_signatures():
    a = canon([op(0, 1, out=2), op(1, 2, 1, out=3)])  # add(relu(x), x)
    b = canon([op(0, 1, out=2), op(1, 1, 1, out=3)])  # add(x, x)
    assert a.id != b.id
    assert "dependency" in diff(a.to_data(), b.to_data())


def test_input_order_matters():
    a = canon([op(1, 1, 2, out=3)], {1: F32, 2: F32_B})
    b = canon([op(1, 2, 1, out=3)], {1: F32, 2: F32_B})
    assert a.id != b.id


def test_chain_differs_from_independent_ops_on_one_input():
    chain = canon([op(0, 1, out=2), op(0, 2, out=3)])
    fan = canon([op(0, 1, out=2), op(0, 1, out=3)])
    assert chain.id != fan.id


def test_freed_values_are_part_of_the_signature():
    a = canon([op(0, 1, out=2), op(0, 2, out=3), Free(FREE, 2)])
    b = canon([op(0, 1, out=2), op(0, 2, out=3)])
    assert a.id != b.id
    assert diff(a.to_data(), b.to_data()).startswith(
        "value t0 freed inside the block in A, not in B"
    )
    assert a.outputs == (("t", 1),) and b.outputs == (("t", 0), ("t", 1))


def test_diff_names_an_op_change_and_a_shape_change():
    a = canon([op(2, 1, 1, out=2), op(0, 2, out=3)])
    b = canon([op(2, 1, 1, out=2), op(3, 2, out=3)])
    assert diff(a.to_data(), b.to_data()) == "op 1: aten.relu → aten.gelu"
    c = canon([op(2, 1, 1, out=2), op(0, 2, out=3)], {1: F32_B})
    assert diff(a.to_data(), c.to_data()) == "op 0 (aten.mul.Tensor): input 0 shape [8, 8] → [4, 8]"
    assert diff(a.to_data(), a.to_data()) is None
    assert "same signature" in diff_text(a.to_data(), a.to_data())


def test_networkx_export_has_ops_inputs_and_edges():
    a = canon([op(0, 1, out=2), op(1, 2, 1, out=3), Free(FREE, 2)])
    g = to_networkx(a.to_data())
    assert g.nodes["in0"]["kind"] == "input" and g.nodes["in0"]["shape"] == [8, 8]
    assert g.nodes["in0"]["dtype"] == "float32"
    assert g.nodes["op0"]["op"] == "aten.relu.default" and g.nodes["op0"]["freed"]
    assert set(g.edges()) == {("in0", "op0"), ("op0", "op1"), ("in0", "op1")}
