"""Random ops compiled draw what eager draws, where eager puts it, on every layout.

The family: each random op a recorded step can hold (a dropout's ``empty_like(x)
.bernoulli_(p)``, the in-place fills, the ``*_like`` makers) on tensors laid out as steps
make them (contiguous, transposed, permuted as ``batch_first`` attention leaves them,
channels-last). Each graph is the aten graph gt records, compiled as gt compiles a block
(``compile_block``, inductor, ``fallback_random`` as the worker sets it) and compared with
its eager run from the same generator state: the numbers must be eager's.
"""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from gt_core.compile.lower import compile_block
from gt_core.compile.rng_layout import pin_random_layouts

aten = torch.ops.aten


def _layouts():
    base = torch.randn(4, 6, 8, 5)
    return {
        "contiguous": base[0].clone(),
        "transposed": base[0, 0].clone().t(),
        "permuted": base[0].clone().permute(1, 0, 2),  # (6, 4, 5) strides (5, 30, 1)
        "channels_last": base.clone().contiguous(memory_format=torch.channels_last),
    }


# Each op as a step's aten graph holds it: x is a computed (not input) tensor of the layout.
OPS = {
    "dropout": lambda y: torch.empty_like(y).bernoulli_(0.9).div_(0.9) * y,
    "bernoulli_tensor": lambda y: torch.empty_like(y).bernoulli_(torch.full_like(y, 0.3)),
    "uniform_": lambda y: torch.empty_like(y).uniform_(-1.0, 1.0) + y,
    "normal_": lambda y: torch.empty_like(y).normal_(0.0, 2.0) + y,
    "exponential_": lambda y: torch.empty_like(y).exponential_(1.5) + y,
    "random_": lambda y: torch.empty_like(y).random_(7) + y,
    "rand_like": lambda y: torch.rand_like(y) * y,
    "randn_like": lambda y: torch.randn_like(y) + y,
    "randint_like": lambda y: torch.randint_like(y, 9) + y,
    "bernoulli": lambda y: torch.bernoulli(torch.sigmoid(y)) * y,
    "rand_factories": lambda y: (
        torch.rand(y.shape)
        + torch.randn(y.shape)
        + torch.randint(0, 5, y.shape) * y
        + torch.randint(3, y.shape)
    ),
}


# What makes the random op's input inside the block: a pointwise op (keeps x's layout), a
# linear then a transpose (nn.MultiheadAttention's batch_first output, a fresh layout), an
# input filled in place.
MAKERS = {
    "pointwise": lambda x, w: x * 2.0,
    "linear_transposed": lambda x, w: torch.nn.functional.linear(x, w).transpose(0, 1),
}


def _inputs(layout):
    x = _layouts()[layout]
    return x, torch.randn(x.shape[-1], x.shape[-1])


def _graph(op, maker, layout):
    inputs = _inputs(layout)
    return make_fx(lambda x, w: OPS[op](MAKERS[maker](x, w)))(*inputs), inputs


CASES = [(o, m, la) for o in OPS for m in MAKERS for la in _layouts()]


@pytest.mark.parametrize(("op", "maker", "layout"), CASES)
def test_a_pinned_graph_run_eagerly_is_the_recorded_one(op, maker, layout):
    """The rewrite alone (no compiler): the pinned graph run eagerly draws what the recorded
    graph draws, and each fill's buffer has the strides eager gave it."""
    gm, inputs = _graph(op, maker, layout)
    torch.manual_seed(3)
    want = gm(*inputs)
    assert pin_random_layouts(gm, list(inputs)) >= 1
    assert any(n.target is torch.ops.gt.random_fill.default for n in gm.graph.nodes)
    torch.manual_seed(3)
    got = gm(*inputs)
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.inductor
@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("maker", list(MAKERS))
def test_compiled_random_ops_draw_as_eager_on_every_layout(maker, layout):
    """Every random op of the family in one graph (so their order is tested too), compiled."""
    import torch._inductor.config as ic

    inputs = _inputs(layout)
    gm = make_fx(lambda x, w: tuple(op(MAKERS[maker](x, w)) for op in OPS.values()))(*inputs)
    torch.manual_seed(5)
    want = gm(*inputs)
    with ic.patch(fallback_random=True):
        fn, _ = compile_block(gm, list(inputs), "inductor", None, False)
        torch.manual_seed(5)
        got = fn(*inputs)
    for name, g, w in zip(OPS, got, want, strict=True):
        torch.testing.assert_close(
            g, w, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}"
        )


def test_two_alike_fills_are_two_draws():
    """Two dropouts of one shape and p are two masks in the pinned graph, as in eager (an op
    a compiler took for pure could be computed once and shared)."""
    x = torch.randn(6, 7)
    gm = make_fx(
        lambda x: (torch.empty_like(x).bernoulli_(0.5), torch.empty_like(x).bernoulli_(0.5))
    )(x)
    pin_random_layouts(gm, [x])
    a, b = gm(x)
    assert not torch.equal(a, b)
    assert all(
        torch.Tag.nondeterministic_seeded in n.target.tags
        for n in gm.graph.nodes
        if n.op == "call_function"
    )


def _module_graph(name):
    """torch.nn's modules with dropout, in training, as a step's forward holds them."""
    torch.manual_seed(0)
    d, n, s = 16, 3, 7
    if name == "mha":
        m = torch.nn.MultiheadAttention(d, 2, dropout=0.2, batch_first=True)
        x = torch.randn(n, s, d)
        fn = lambda x: m(x, x, x, need_weights=False)[0]  # noqa: E731
        inputs = [x]
    elif name.startswith("encoder"):
        m = torch.nn.TransformerEncoderLayer(
            d, 2, 32, dropout=0.1, batch_first="batch_first" in name, norm_first="pre" in name
        )
        x = torch.randn(n, s, d) if "batch_first" in name else torch.randn(s, n, d)
        fn, inputs = m, [x]
    else:
        m = torch.nn.Transformer(d, 2, 1, 1, 32, dropout=0.1, batch_first=True)
        src, tgt = torch.randn(n, s, d), torch.randn(n, s, d)
        fn, inputs = (lambda a, b: m(a, b)), [src, tgt]  # noqa: E731
    m.train()
    with torch.no_grad():
        return make_fx(fn)(*inputs), inputs


MODULES = ["mha", "encoder", "encoder_batch_first", "encoder_batch_first_pre", "transformer"]


@pytest.mark.inductor
@pytest.mark.parametrize("name", MODULES)
def test_torch_nn_modules_with_dropout_compile_to_eager_draws(name):
    """nn.Transformer's layers in training, batch_first or not: the compiled masks are
    eager's (before the pinning, nn.Transformer's batch_first self-attention dropout drew
    eager's numbers into other places: its output differed by ~1.8)."""
    import torch._inductor.config as ic

    gm, inputs = _module_graph(name)
    torch.manual_seed(7)
    with torch.no_grad():
        want = gm(*inputs)
        with ic.patch(fallback_random=True):
            fn, _ = compile_block(gm, inputs, "inductor", None, False)
            torch.manual_seed(7)
            out = fn(*inputs)
    got = out[0] if isinstance(out, (list, tuple)) else out
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
