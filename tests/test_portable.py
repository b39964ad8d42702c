"""CPU-only kernels the client records, run by a non-CPU worker in portable form.

The CPU kernels are the oracle: the portable forms run here on the CPU must give their values
and their output layouts. A worker forced to use them trains the transformer block (eagerly
and compiled) exactly as eager does.
"""

import pytest
import torch
from conftest import assert_close
from models import TRANSFORMER, train

import gt_core
from gt_core.worker_process import executor as _executor
from gt_core.worker_process import portable as _portable

aten = torch.ops.aten
FWD = aten._scaled_dot_product_flash_attention_for_cpu.default
BWD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default
GPU = torch.device("cuda")  # only its type is read: nothing runs on it


def _qkv(transposed: bool, seed: int):
    g = torch.Generator().manual_seed(seed)
    if transposed:  # (batch, seq, heads, dim) memory, as a model's split + transpose makes it
        return [torch.randn(2, 12, 4, 8, generator=g).transpose(1, 2) for _ in range(3)]
    return [torch.randn(2, 4, 12, 8, generator=g) for _ in range(3)]


MASKS = {
    "none": lambda: None,
    "float": lambda: torch.randn(12, 12, generator=torch.Generator().manual_seed(5)),
}  # the CPU kernel takes float masks only (the composite op converts a bool one first)


@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
@pytest.mark.parametrize(
    "is_causal, mask", [(True, "none")] + [(False, m) for m in MASKS], ids=lambda v: str(v)
)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_portable_attention_equals_the_cpu_kernels(transposed, is_causal, mask, scale):
    fwd, bwd = _portable.for_device(FWD, GPU), _portable.for_device(BWD, GPU)
    assert isinstance(fwd, _portable.Portable) and isinstance(bwd, _portable.Portable)
    q, k, v = _qkv(transposed, seed=1)
    kw = dict(attn_mask=MASKS[mask](), scale=scale)
    want = FWD(q, k, v, 0.0, is_causal, **kw)
    got = fwd(q, k, v, 0.0, is_causal, **kw)
    grad = torch.randn_like(want[0])
    want += BWD(grad, q, k, v, want[0], want[1], 0.0, is_causal, **kw)
    got += bwd(grad, q, k, v, got[0], got[1], 0.0, is_causal, **kw)
    for name, a, b in zip(("out", "logsumexp", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
        assert a.stride() == b.stride(), (
            f"{name}: layout {a.stride()} is not the kernel's {b.stride()}"
        )


@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("is_causal", [False, True])
def test_portable_grouped_query_attention_equals_the_cpu_kernels(kv_heads, is_causal):
    """Fewer key/value heads than query heads (Llama's grouped-query attention): each key/value
    head serves a group of query heads, and its gradient sums over the group."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 12, 8, generator=g)
    k, v = (torch.randn(2, 12, kv_heads, 8, generator=g).transpose(1, 2) for _ in range(2))
    fwd, bwd = _portable.for_device(FWD, GPU), _portable.for_device(BWD, GPU)
    want = FWD(q, k, v, 0.0, is_causal)
    got = fwd(q, k, v, 0.0, is_causal)
    grad = torch.randn_like(want[0])
    want += BWD(grad, q, k, v, want[0], want[1], 0.0, is_causal)
    got += bwd(grad, q, k, v, got[0], got[1], 0.0, is_causal)
    for name, a, b in zip(("out", "logsumexp", "dq", "dk", "dv"), got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=lambda m, n=name: f"{n}: {m}")
        assert a.stride() == b.stride(), (
            f"{name}: layout {a.stride()} is not the kernel's {b.stride()}"
        )


def test_ops_stay_themselves_on_the_cpu_and_dropout_is_refused_elsewhere():
    assert _portable.for_device(FWD, torch.device("cpu")) is FWD
    assert _portable.for_device(aten.mm.default, GPU) is aten.mm.default
    fwd = _portable.for_device(FWD, GPU)
    assert _executor.op_name(fwd) == "aten._scaled_dot_product_flash_attention_for_cpu.default"
    q, k, v = _qkv(False, seed=2)
    with pytest.raises(NotImplementedError, match="dropout_p=0.1 on a GPU worker"):
        fwd(q, k, v, 0.1, True)


@pytest.fixture
def as_if_on_gpu(inprocess, monkeypatch):
    """The in-process worker replaces CPU-only ops as a GPU worker does (its tensors stay here)."""
    monkeypatch.setattr(_executor, "for_device", lambda op, device: _portable.for_device(op, GPU))
    gt_core.configure(
        auto_compile=True,
        backend="aot_eager",
        background=False,
        threshold=3,
        regression_samples=10_000,
    )
    yield inprocess


def test_transformer_block_trains_through_portable_attention_compiled_and_equal(as_if_on_gpu):
    kw = dict(
        **TRANSFORMER,
        steps=16,
        sync_every=1,
    )
    ref, ref_losses = train(on_worker=False, **kw)
    got, got_losses = train(on_worker=True, **kw)
    assert got_losses == pytest.approx(ref_losses, abs=1e-5)
    for a, b in zip(got.parameters(), ref.parameters(), strict=True):
        assert_close(a, b, atol=1e-5)
    ex = gt_core.client.capture.session().transport.ex
    stand_ins = [op for op in ex.ops.values() if isinstance(op, _portable.Portable)]
    assert {op.op for op in stand_ins} == {FWD, BWD}
    paths = gt_core.report().to_data()["hot_paths"]
    assert any(
        p["status"] == "compiled" and p["compiled_runs"] >= 3 and _executor.op_name(FWD) in p["ops"]
        for p in paths
    ), paths


def test_llama_trains_through_portable_grouped_query_attention_equal_to_eager(as_if_on_gpu):
    """A library model with grouped-query attention (``transformers`` Llama: 4 query heads, 2
    key/value heads), as a GPU worker runs it: eagerly, then compiled, equal to eager."""
    pytest.importorskip("transformers")
    from gt_bench import zoo

    z = zoo.build("llama")
    want = [z.step(*z.batch).item() for _ in range(8)]
    want_state = [t.detach().clone() for t in z.state]
    with gt_core.capture():
        z = zoo.build("llama")
        got = [z.step(*z.batch) for _ in range(8)]
        got = [x.item() for x in got]
        state = [t.detach().cpu() for t in z.state]
    assert got == pytest.approx(want, abs=1e-5)
    for a, b in zip(state, want_state, strict=True):
        assert_close(a, b, atol=1e-5)
    ex = gt_core.client.capture.session().transport.ex
    assert {op.op for op in ex.ops.values() if isinstance(op, _portable.Portable)} == {FWD, BWD}
    assert any(p["compiled_runs"] for p in gt_core.report().to_data()["hot_paths"])
