"""Explicit ``torch.Generator`` objects: an op that draws from one runs here, in the kernel.

The rule: an op with a ``torch.Generator`` argument runs for real in the client, on plain CPU
copies of its worker tensors and with the user's generator. Its tensor results are uploaded to
the worker; a worker tensor it writes in place takes the new value there by a recorded
``aten.copy_``, so every view of it sees the new value too.

Why: a generator is the kernel's object, not the worker's. Its state is the user's (seeded
outside the capture, read with ``get_state``, shared by a DataLoader and its sampler), so
drawing where it lives gives eager's numbers and advances it exactly as eager does.
``generator=None`` draws from the global generator, which the worker keeps equal to eager's
(``torch.manual_seed`` seeds both): those ops stay recorded for the worker, and so does such a
draw on plain tensors (made outside the capture), which would otherwise run here on the
kernel's own generator, out of eager's order (gt_core.client.recording.mode; a plain tensor it writes
in place gets its new value back, as with any op recorded in place on one).
"""

from __future__ import annotations

import torch

from gt_core.client.recording.proxy_fields import set_shadow
from gt_core.client.recording.shadows import written_args
from gt_core.client.recording.uploads import upload
from gt_core.client.session import live_session

__all__ = ["takes_generator", "has_generator", "run_here"]

aten = torch.ops.aten

_takes: dict = {}  # op -> whether its schema has a Generator argument
_INDEX_SHADOW = 1 << 20  # elements: an integer draw up to this size keeps its shadow


def takes_generator(func) -> bool:
    """True when ``func``'s schema has a ``Generator`` argument (cached per op)."""
    r = _takes.get(func)
    if r is None:
        r = _takes[func] = any("Generator" in str(a.type) for a in func._schema.arguments)
    return r


def has_generator(args, kwargs) -> bool:
    """True when an argument is a ``torch.Generator`` (``generator=None`` is not one)."""
    for a in args:
        if isinstance(a, torch.Generator):
            return True
    for v in kwargs.values():
        if isinstance(v, torch.Generator):
            return True
    return False


# Draws that never read the values of ``self``: they overwrite it, or take only its shape and
# strides. Its old value is not fetched (``nn.init`` on a model's weights would otherwise be a
# round trip per weight).
_SELF_UNREAD = {
    aten.normal_.default,
    aten.uniform_.default,
    aten.random_.default,
    aten.random_.to,
    getattr(aten.random_, "from"),  # (a keyword in Python)
    aten.cauchy_.default,
    aten.log_normal_.default,
    aten.exponential_.default,
    aten.geometric_.default,
    aten.bernoulli_.float,
    aten.bernoulli_.Tensor,
    aten.rand_like.generator,
    aten.randn_like.generator,
    aten.randint_like.generator,
    aten.randint_like.Tensor_generator,
    aten.randint_like.low_generator_dtype,
}


def run_here(cls, func, args, kwargs, record):
    """Run ``func`` here on plain copies of its worker tensors (proxies of class ``cls``);
    results go to the worker.

    ``record`` records the write-backs (passed in: the recording module calls this one).
    """
    written = {id(p) for p in written_args(func, args, kwargs) if isinstance(p, cls)}
    unread = set()  # worker tensors whose old value the op does not read: not fetched
    if func in _SELF_UNREAD and not any(x is args[0] for x in (*args[1:], *kwargs.values())):
        unread.add(id(args[0]))
    copies: dict[int, tuple] = {}  # id(proxy) -> (proxy, its plain copy)
    plain_args = [_home(cls, a, copies, unread) for a in args]
    plain_kwargs = {k: _home(cls, v, copies, unread) for k, v in kwargs.items()}
    session = next(iter(copies.values()))[0].gt_session if copies else live_session()
    session.check()
    with torch._C._DisableTorchDispatch():
        out = func(*plain_args, **plain_kwargs)
    # What a returned tensor stands for: a plain tensor argument itself (written in place
    # here, as in eager), or the worker tensor whose written copy it is.
    proxy_of = {id(t): t for t in _plain_tensors(cls, (*args, *kwargs.values()))}
    for key in written:
        p, c = copies[key]
        if c.shape != p.shape:  # an out= tensor the op resized
            record(cls, aten.resize_.default, (p, list(c.shape)), {})
        record(cls, aten.copy_.default, (p, upload(cls, session, c, cache=False)), {})
        proxy_of[id(c)] = p
    return _away(cls, out, proxy_of, session)


def _home(cls, a, copies, unread):
    """The argument with its worker tensors replaced by plain copies of their values."""
    if isinstance(a, cls):
        hit = copies.get(id(a))
        if hit is None:
            hit = copies[id(a)] = (a, _copy_of(a, read=id(a) not in unread))
        return hit[1]
    if type(a) in (list, tuple):
        return type(a)(_home(cls, x, copies, unread) for x in a)
    return a


def _copy_of(p, read: bool) -> torch.Tensor:
    """A plain tensor laid out as ``p`` (a draw fills elements in memory order, and an output
    follows its inputs' strides), holding ``p``'s value when ``read``."""
    with torch._C._DisableTorchDispatch():
        c = torch.empty_strided(p.shape, p.stride(), dtype=p.dtype)
    if read:
        value = p.cpu()
        with torch._C._DisableTorchDispatch():
            into = c
            for d, (n, st) in enumerate(zip(p.shape, p.stride(), strict=True)):
                if st == 0 and n > 1:  # an expanded dim: one element in memory along it
                    into, value = into.narrow(d, 0, 1), value.narrow(d, 0, 1)
            into.copy_(value)
    return c


def _plain_tensors(cls, xs):
    for x in xs:
        if type(x) in (list, tuple):
            yield from _plain_tensors(cls, x)
        elif isinstance(x, torch.Tensor) and not isinstance(x, cls):
            yield x


def _away(cls, r, proxy_of, session):
    """The op's result as the caller sees it: worker tensors in place of plain ones. A new
    integer result (a sampler's ``randperm``, a ``randint``) keeps its value here as its
    shadow: read back at once (``.tolist()``), it needs no round trip to the worker."""
    if isinstance(r, torch.Tensor):
        p = proxy_of.get(id(r))
        if p is not None:
            return p
        p = upload(cls, session, r, cache=False)
        if not (r.is_floating_point() or r.is_complex()) and r.numel() <= _INDEX_SHADOW:
            set_shadow(p, r)
        return p
    if type(r) in (list, tuple):
        return type(r)(_away(cls, x, proxy_of, session) for x in r)
    return r


def draws(func) -> bool:
    """True when ``func`` may draw random numbers (tagged ``nondeterministic_seeded``)."""
    r = _draws.get(func)
    if r is None:
        r = _draws[func] = torch.Tag.nondeterministic_seeded in func.tags
    return r


_draws: dict = {}
