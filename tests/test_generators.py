"""Explicit torch.Generator objects in a capture: they draw in the kernel, exactly as in eager.

Each test runs the same code eagerly on plain tensors and inside a capture, each time from a
generator seeded alike: the values, and the generator's state afterwards, must be eager's.
"""

import pytest
import torch
from conftest import assert_close
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import gt_core
from gt_core.client.capture import session


def _plain(x):
    """Worker tensors (in lists, tuples, dicts) brought home as plain tensors."""
    if gt_core.is_remote(x):
        return x.cpu()
    if type(x) in (list, tuple):
        return type(x)(_plain(v) for v in x)
    if type(x) is dict:
        return {k: _plain(v) for k, v in x.items()}
    return x


def _eager_and_captured(fn, seed=0):
    """``fn(g)`` eagerly and in a capture, from a generator seeded ``seed`` each time.

    -> ((eager's result, its generator's state), (the capture's result, its generator's
    state)); the capture's result as ``fn`` returned it (worker tensors stay so).
    """
    g = torch.Generator().manual_seed(seed)
    want = fn(g)
    want_state = g.get_state()
    g = torch.Generator().manual_seed(seed)
    with gt_core.capture():
        got = fn(g)
    return (want, want_state), (got, g.get_state())


def _assert_equal(got, want):
    got, want = _plain(got), _plain(want)
    if isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want), (got, want)
    elif type(want) in (list, tuple):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _assert_equal(a, b)
    else:
        assert got == want


FACTORIES = {
    "randn": lambda g: torch.randn(3, 4, generator=g),
    "rand": lambda g: torch.rand(5, dtype=torch.float64, generator=g),
    "randint": lambda g: torch.randint(10, (3, 3), generator=g),
    "randint-low": lambda g: torch.randint(-5, 5, (7,), generator=g),
    "randperm": lambda g: torch.randperm(20, generator=g),
    "normal": lambda g: torch.normal(2.0, 3.0, size=(4, 2), generator=g),
    "normal-of-a-worker-mean": lambda g: torch.normal(
        torch.arange(6.0).reshape(2, 3).t(), 1.0, generator=g
    ),
    "multinomial": lambda g: torch.multinomial(
        torch.tensor([0.1, 0.2, 0.3, 0.4]), 6, True, generator=g
    ),
    "multinomial-expanded": lambda g: torch.multinomial(
        torch.tensor([0.1, 0.2, 0.7]).expand(4, 3), 2, generator=g
    ),
    "bernoulli": lambda g: torch.bernoulli(torch.full((3, 5), 0.3).t(), generator=g),
    "randn_like": lambda g: torch.randn_like(torch.zeros(4, 3).t(), generator=g),
    "0-d": lambda g: torch.randint(100, (), generator=g),
    "twice": lambda g: [torch.randn(3, generator=g), torch.rand(2, generator=g)],
}


@pytest.mark.parametrize("make", FACTORIES.values(), ids=FACTORIES.keys())
def test_a_factory_with_a_generator_draws_eagers_values_and_advances_it_as_eager(inprocess, make):
    (want, want_state), (got, got_state) = _eager_and_captured(make)
    for t in got if type(got) is list else [got]:
        assert gt_core.is_remote(t)
    _assert_equal(got, want)
    assert torch.equal(got_state, want_state)


def test_randperm_tolist_as_a_random_sampler_calls_it(inprocess):
    (want, want_state), (got, got_state) = _eager_and_captured(
        lambda g: [torch.randperm(30, generator=g).tolist() for _ in range(3)]
    )
    assert got == want
    assert torch.equal(got_state, want_state)


VIEWS = {
    "whole": lambda x: x,
    "rows": lambda x: x[1:3],
    "strided": lambda x: x[:, 1::2],
    "transposed": lambda x: x.t(),
    "0-d": lambda x: x[2, 3],
}

IN_PLACE = {
    "normal_": lambda t, g: t.normal_(1.0, 2.0, generator=g),
    "uniform_": lambda t, g: t.uniform_(-1.0, 1.0, generator=g),
    "random_": lambda t, g: t.random_(generator=g),
    "random_-to": lambda t, g: t.random_(7, generator=g),
    "random_-from-to": lambda t, g: t.random_(-3, 3, generator=g),
    "bernoulli_": lambda t, g: t.bernoulli_(0.5, generator=g),
    "bernoulli_-of-a-tensor": lambda t, g: t.bernoulli_(torch.full(t.shape, 0.25), generator=g),
    "exponential_": lambda t, g: t.exponential_(generator=g),
    "log_normal_": lambda t, g: t.log_normal_(generator=g),
    "cauchy_": lambda t, g: t.cauchy_(generator=g),
    "geometric_": lambda t, g: t.geometric_(0.3, generator=g),
}


@pytest.mark.parametrize("view", VIEWS.values(), ids=VIEWS.keys())
@pytest.mark.parametrize("draw", IN_PLACE.values(), ids=IN_PLACE.keys())
def test_an_in_place_draw_on_a_worker_tensor_and_its_views_is_eagers(inprocess, draw, view):
    def fn(g):
        x = torch.arange(24.0).reshape(4, 6)
        flat = x.view(-1)  # an alias made before the draw: it must see it
        v = view(x)
        out = draw(v, g)
        return out is v, x, flat, v

    (want, want_state), (got, got_state) = _eager_and_captured(fn)
    assert got[0] and want[0]  # the op returns its input, as in eager
    assert all(gt_core.is_remote(t) for t in got[1:])
    _assert_equal(got[1:], want[1:])
    assert torch.equal(got_state, want_state)


def test_a_draw_whose_probabilities_are_its_own_input(inprocess):
    (want, want_state), (got, got_state) = _eager_and_captured(
        lambda g: torch.full((3, 4), 0.4).bernoulli_(torch.full((3, 4), 0.4), generator=g)
    )
    _assert_equal(got, want)

    def own(g):
        x = torch.linspace(0.0, 1.0, 12).reshape(3, 4)
        return x.bernoulli_(x, generator=g)  # reads x's old values while writing x

    (want, want_state), (got, got_state) = _eager_and_captured(own)
    _assert_equal(got, want)
    assert torch.equal(got_state, want_state)


def test_a_plain_tensor_drawn_in_place_with_worker_probabilities_stays_plain(inprocess):
    def fn(g, plain):
        p = torch.linspace(0.0, 1.0, 8)  # a worker tensor in the capture
        return plain.bernoulli_(p, generator=g) is plain, plain

    want = fn(torch.Generator().manual_seed(3), torch.zeros(8))
    plain = torch.zeros(8)
    with gt_core.capture():
        got = fn(torch.Generator().manual_seed(3), plain)
    assert got[0] and not gt_core.is_remote(plain)
    _assert_equal(got, want)


def test_out_with_a_generator_writes_the_worker_tensor(inprocess):
    def fn(g):
        y = torch.zeros(2, 3)
        r = torch.randn(2, 3, generator=g, out=y)
        return r is y, y

    (want, want_state), (got, got_state) = _eager_and_captured(fn)
    assert got[0] and gt_core.is_remote(got[1])
    _assert_equal(got, want)
    assert torch.equal(got_state, want_state)


def test_a_worker_tensor_drawn_after_the_capture_ended(inprocess):
    """Outside a capture, ops on a worker tensor are still recorded: the draw is eager's too."""
    with gt_core.capture():
        x = torch.zeros(3, 4)
    g = torch.Generator().manual_seed(1)
    x.normal_(generator=g)
    want_g = torch.Generator().manual_seed(1)
    want = torch.zeros(3, 4).normal_(generator=want_g)
    assert gt_core.is_remote(x)
    _assert_equal(x, want)
    assert torch.equal(g.get_state(), want_g.get_state())


INITS = {
    "normal_": lambda w, g: nn.init.normal_(w, 0.0, 0.02, generator=g),
    "uniform_": lambda w, g: nn.init.uniform_(w, -0.1, 0.1, generator=g),
    "kaiming_uniform_": lambda w, g: nn.init.kaiming_uniform_(w, a=5**0.5, generator=g),
    "xavier_normal_": lambda w, g: nn.init.xavier_normal_(w, generator=g),
    "trunc_normal_": lambda w, g: nn.init.trunc_normal_(w, std=0.5, generator=g),
    "orthogonal_": lambda w, g: nn.init.orthogonal_(w, generator=g),
}


@pytest.mark.parametrize("init", INITS.values(), ids=INITS.keys())
def test_nn_init_with_a_generator_on_a_linear_built_in_the_capture(inprocess, init):
    def fn(g):
        torch.manual_seed(0)  # the Linear's own init draws from the global generator
        lin = nn.Linear(8, 5)
        init(lin.weight, g)
        return lin.weight, lin.bias

    (want, want_state), (got, got_state) = _eager_and_captured(fn)
    assert all(gt_core.is_remote(t) for t in got)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b)  # (the init's arithmetic after the draw runs on the worker)
    assert torch.equal(got_state, want_state)


def _batches(X, Y, epochs=2, **loader):
    out = []
    for _ in range(epochs):
        for x, y in DataLoader(TensorDataset(X, Y), batch_size=16, **loader):
            out.append((x, y))
    return out


def _data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(50, 3, generator=g), torch.arange(50)


@pytest.mark.parametrize("worker", ["inprocess", "process"])
@pytest.mark.parametrize("made", ["outside", "inside"])
def test_a_shuffled_dataloader_with_a_generator_gives_eagers_batches(request, worker, made):
    request.getfixturevalue(worker)
    X, Y = _data()
    g = torch.Generator().manual_seed(0)
    want = _batches(X, Y, shuffle=True, generator=g)
    want_state = g.get_state()
    g = torch.Generator().manual_seed(0)
    with gt_core.capture():
        if made == "inside":  # the dataset's tensors are worker tensors
            X, Y = _data()
            assert gt_core.is_remote(X) and gt_core.is_remote(Y)
        got = _batches(X, Y, shuffle=True, generator=g)
    assert all(gt_core.is_remote(t) == (made == "inside") for batch in got for t in batch)
    _assert_equal(got, want)
    assert torch.equal(g.get_state(), want_state)


@pytest.mark.parametrize("worker", ["inprocess", "process"])
def test_a_shuffled_dataloader_seeded_by_manual_seed_in_the_capture(request, worker):
    """No generator: the loader's seeds come from the global generator, on the worker."""
    request.getfixturevalue(worker)
    X, Y = _data()
    torch.manual_seed(0)
    want = _batches(X, Y, shuffle=True)
    with gt_core.capture():
        torch.manual_seed(0)
        got = _batches(X, Y, shuffle=True)
    _assert_equal(got, want)


def test_generator_none_stays_recorded_on_the_worker(inprocess):
    def fn():
        torch.manual_seed(0)
        a = torch.randn(3, 4, generator=None)
        b = torch.zeros(5).normal_(generator=None)
        c = torch.randperm(9, generator=None)
        return a, b, c

    want = fn()
    with gt_core.capture():
        uploads = session().counters["uploads"]
        got = fn()
        assert session().counters["uploads"] == uploads  # drawn there, none sent from here
        torch.randn(3, generator=torch.Generator().manual_seed(0))
        assert session().counters["uploads"] == uploads + 1  # (an explicit one: drawn here)
    assert all(gt_core.is_remote(t) for t in got)
    _assert_equal(got, want)


def _global(draw):
    return lambda h: draw(h, None)


ON_PLAIN = {  # draws from the global generator on a plain (4, 6) tensor h made outside
    **{f"{k}-in-place": _global(d) for k, d in IN_PLACE.items()},
    "randn_like": lambda h: torch.randn_like(h),
    "rand_like": lambda h: torch.rand_like(h),
    "randint_like": lambda h: torch.randint_like(h, 9),
    "bernoulli": lambda h: torch.bernoulli(h.sigmoid()),
    "dropout": lambda h: torch.nn.functional.dropout(h, 0.5),
    "multinomial": lambda h: torch.multinomial(h.abs() + 0.1, 3),
    "normal-of-a-mean": lambda h: torch.normal(h, 1.0),
    "poisson": lambda h: torch.poisson(h.abs()),
    "randn-out": lambda h: torch.randn(2, 5, out=h),
}


@pytest.mark.parametrize("draw", ON_PLAIN.values(), ids=ON_PLAIN.keys())
def test_a_draw_from_the_global_generator_on_a_plain_tensor_continues_eagers_stream(
    inprocess, draw
):
    """A tensor made outside the capture stays plain inside it; a draw on it (in place,
    ``*_like``, ``out=``) takes its numbers from where eager's stream is, the worker's
    generator, between draws on worker tensors: the kernel's generator gave other numbers."""

    def fn(h):
        torch.manual_seed(0)
        before = torch.randn(3)
        out = draw(h)
        return out is h, h, out, before, torch.rand(2)

    def make():
        return torch.arange(24.0).reshape(4, 6) / 24

    want = fn(make())
    h = make()
    with gt_core.capture():
        got = fn(h)
        assert not gt_core.is_remote(h)  # written in place, it stays plain
        got = _plain(got)
    assert got[0] == want[0]
    _assert_equal(got[1:], want[1:])


def _saved_and_restored():
    """The global generator's state read and put back between draws, as fork_rng does."""
    torch.manual_seed(0)
    a = torch.randn(3)
    state = torch.get_rng_state()
    b = torch.randn(3)
    torch.random.set_rng_state(state)
    c = torch.randn(3)  # eager: b again
    with torch.random.fork_rng():
        torch.randn(5)
    return a, b, c, torch.rand(2), torch.random.get_rng_state()


def _checkpointed(reentrant: bool):
    """A dropout inside torch.utils.checkpoint: the backward recomputes it from the state
    saved at the forward, and its mask must be the forward's."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = nn.Linear(8, 8)
    x = torch.randn(4, 8, requires_grad=True)
    y = checkpoint(lambda x: nn.functional.dropout(lin(x), 0.5), x, use_reentrant=reentrant)
    y.sum().backward()
    return y, x.grad, lin.weight.grad


RESTORED = {
    "get-and-set-rng-state": _saved_and_restored,
    "checkpoint": lambda: _checkpointed(False),
    "checkpoint-reentrant": lambda: _checkpointed(True),
}


@pytest.mark.parametrize("worker", ["inprocess", "process"])
@pytest.mark.parametrize("fn", RESTORED.values(), ids=RESTORED.keys())
def test_the_global_generators_state_saved_and_restored_in_a_capture_is_the_workers(
    request, worker, fn
):
    """torch.get_rng_state reads the worker's generator (where eager's stream is), and
    torch.set_rng_state sets it there in the stream's order: the kernel's own state is stale
    inside a capture, and a checkpointed dropout recomputed another mask from it."""
    request.getfixturevalue(worker)
    want = fn()
    with gt_core.capture():
        got = _plain(fn())
    _assert_equal(got, want)
