"""A block's graphs make their tensors on the worker's device, whatever the client recorded.

The client sees every worker tensor as a CPU tensor: ``torch.arange(n, device=x.device)``
records ``device=cpu``. A GPU worker's graphs must name its GPU, or they make CPU tensors
in the middle of a GPU graph. Without a GPU the worker's device here is ``meta``: a graph
built for it and run on meta inputs gives meta tensors only where every op that names a
device was placed (a CPU tensor made inside would be mixed with meta ones, or returned).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gt_core
from gt_core.compile.lower import build_graph
from gt_core.stream.placement import NONE, kind_of, placed

META = torch.device("meta")


def _engine():
    return gt_core.client.capture.session().transport.engine


@pytest.fixture
def hot(inprocess):
    gt_core.configure(auto_compile=True, backend="aot_eager", background=False, threshold=3)
    yield inprocess


def _factories_step():
    """A step whose masks, positions and noise are made inside it, as library code does."""
    torch.manual_seed(0)
    emb, head = nn.Embedding(11, 8), nn.Linear(8, 11)
    opt = torch.optim.AdamW([*emb.parameters(), *head.parameters()], lr=1e-2)
    ids = torch.randint(0, 11, (2, 6))

    def step():
        pos = torch.arange(ids.shape[1], device=ids.device)  # (as Llama's cache_position)
        mask = torch.full((6, 6), float("-inf"), device=ids.device).triu(1)
        h = emb(ids) + pos[:, None].float() * 0.01 + torch.zeros(1, device=ids.device)
        att = torch.softmax(h @ h.transpose(1, 2) + mask, -1) @ h
        noise = torch.randn(att.shape, device=ids.device) * 0.0
        loss = F.cross_entropy(head(att + noise).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    return step


def _llama_step():
    pytest.importorskip("transformers")
    from gt_bench import zoo

    z = zoo.build("llama")
    return lambda: z.step(*z.batch)


def _meta_inputs(block, lifted: bool) -> list:
    ins = [torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device=META)
           for m in block.form.canon.input_meta]  # fmt: skip
    scalars = [torch.zeros((), dtype=dt, device=META) if lifted else 0.5
               for dt in block.form.scalar_dtypes]  # fmt: skip
    return ins + scalars


def _assert_on_worker_device(gm, inputs) -> None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and kind_of(node.target) != NONE:
            assert node.kwargs.get("device") in (META, None), node.format_node()
    outs = gm(*inputs)
    devices = {t.device for t in outs if isinstance(t, torch.Tensor)}
    assert devices <= {META}, devices


def _blocks_after(make_step, calls=8):
    with gt_core.capture():
        step = make_step()  # (its model and batch on the worker)
        for _ in range(calls):
            loss = step()
        loss.item()
        return list(_engine().blocks.values())


@pytest.mark.parametrize("make_step", [_factories_step, _llama_step], ids=["factories", "llama"])
def test_a_blocks_eager_and_compiled_graphs_make_their_tensors_on_the_workers_device(
    hot, make_step
):
    blocks = _blocks_after(make_step)
    with_factories = [
        b
        for b in blocks
        if any(kind_of(b.form.ops[e.op]) != NONE for e in b.form.canon.entries if e.kind == "op")
    ]
    assert with_factories, "the step's factory ops were not in any block"
    for b in with_factories:
        n = len(b.form.scalar_dtypes)
        eager = build_graph(
            b.form.canon, b.form.ops, b.form.out_paths, False, n, lift=False, device=META
        )
        _assert_on_worker_device(eager, _meta_inputs(b, lifted=False))
        compiled = build_graph(b.form.canon, b.form.ops, b.form.out_paths, True, n, device=META)
        _assert_on_worker_device(compiled, _meta_inputs(b, lifted=True))


def test_a_worker_on_another_device_builds_eager_graphs_and_compiles_for_its_device(
    hot, monkeypatch
):
    """The registry and the compiler build for the worker's device (here meta), blocks that
    name a device included: such blocks ran op by op on a GPU worker before."""
    (block,) = [b for b in _blocks_after(_factories_step) if b.fn is not None]
    engine = _engine()
    monkeypatch.setattr(engine.ex, "device", META)
    monkeypatch.setattr(engine.compiler, "device", META)
    canon = block.form.canon
    metas = tuple(m._replace(device=META) for m in canon.input_meta)  # (a worker's values)
    canon = dataclasses.replace(canon, input_meta=metas)
    monkeypatch.setattr(block, "form", dataclasses.replace(block.form, canon=canon))
    gm = engine.registry._eager_graph(block)
    assert gm is not None
    _assert_on_worker_device(gm, _meta_inputs(block, lifted=False))
    fn, _, _ = engine.compiler._compile_here(block, engine.compiler.options)
    outs = fn(*_meta_inputs(block, lifted=True))
    assert {t.device for t in outs if isinstance(t, torch.Tensor)} <= {META}


_aten = torch.ops.aten


@pytest.mark.parametrize(
    "op, kwargs, want",
    [
        (_aten.arange.default, {"device": torch.device("cpu")}, META),
        (_aten.zeros.default, {}, META),  # (a factory's default device is the CPU)
        (_aten.ones_like.default, {}, None),  # (its input's device: the worker's already)
        (_aten._to_copy.default, {"device": torch.device("cpu")}, META),  # x.cpu() of a proxy
        (_aten._to_copy.default, {"device": torch.device("cuda", 1)}, torch.device("cuda", 1)),
    ],
)
def test_ops_naming_the_cpu_or_no_device_are_placed_a_named_accelerator_kept(op, kwargs, want):
    assert placed(kwargs, META, kind_of(op)).get("device") == want
    assert kind_of(_aten.add.Tensor) == NONE


def test_pinned_memory_is_asked_of_the_cpu_only():
    assert (
        placed({"pin_memory": True}, META, kind_of(_aten.empty.memory_format))["pin_memory"]
        is False
    )
