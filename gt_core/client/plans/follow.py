"""Following a plan: the op a hot block's occurrence expects next, recorded by its plan.

While the client's stream matches one candidate occurrence of a plan, an op recorded there
before (its entry's ``learned``) is bound from the plan, without building an instruction or
looking up the metadata cache. The matcher (``plan_match.Candidate``) keeps the bindings.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gt_core.client.recording.meta import ANY_FLOAT, SCALARS, Alias, New, floats_free
from gt_core.stream.lift import Scalar
from gt_core.stream.plan import Slot


class Learned(NamedTuple):
    """What recording a plan entry found once: what later occurrences follow it by."""

    op: Any  # the OpOverload
    varying: tuple  # the cache key's parts the entry's template leaves free (see varying)
    template: New | Alias  # its output (gt_core.client.recording.meta)
    n_proxies: int  # its proxy arguments


def follow(cls, session, func, args, kwargs):
    """The op the plan of the occurrence being matched expects next, recorded by the plan
    (its output a proxy of class ``cls``).

    Taken only where recording that entry once found this op, and the parts of its cache key
    that can vary between occurrences (its tensors' metadata, its lifted scalars' kind) are
    the same now; the rest of the key is the template's literals, checked equal. So the
    output's metadata is what the cache would give. Anything else returns None: the op is
    recorded the usual way, and matched (or not) as an instruction.
    """
    rp = session.matcher
    c = rp.cands[0]
    learned, e = c.upcoming()
    if learned is None or learned.op is not func:
        return None
    eargs, ekw = e.args, e.kwargs
    if len(args) != len(eargs) or len(kwargs) != len(ekw):
        return None
    parts = []
    proxies = []
    if not _positional(cls, session, c, func, eargs, args, parts, proxies):
        return None
    for k, v in kwargs.items():
        tmpl = ekw.get(k, _MISSING)
        tv = type(v)
        if type(tmpl) is Scalar:
            if tv is not float and tv is not int:
                return None
            c.lift(tmpl.k, float(v))
            parts.append(_scalar_part(v, func))
        elif tv is not type(tmpl) or tmpl != v or tv not in SCALARS:
            return None
    if tuple(parts) != learned.varying or len(proxies) != learned.n_proxies:
        return None
    t = learned.template
    if type(t) is New:
        vid = c.produce(e.outs[0], session.ids)  # (the op's one output: its id taken)
        if vid is None:
            return None
        result = cls(session, vid, t.meta, t.mid)
    else:
        result = proxies[t.index]
    session.counters["ops"] += 1
    rp.followed_op(c)
    return result


def _positional(cls, session, c, func, eargs, args, parts, proxies) -> bool:
    """Whether the positional ``args`` fit the entry's ``eargs`` (lengths equal), bound and
    lifted into ``c`` as they are checked; their cache key parts and proxies are appended to
    ``parts`` and ``proxies``."""
    for tmpl, a in zip(eargs, args):  # noqa: B905 (lengths checked)
        ta = type(a)
        if ta is cls:
            if a.gt_session is not session or a.gt_shadow is not None or type(tmpl) is not Slot:
                return False
            if not c.bind(tmpl, a.gt_value_id, a.gt_meta):
                return False
            parts.append(a.gt_meta_key)
            proxies.append(a)
        elif type(tmpl) is Scalar:
            if ta is not float and ta is not int:
                return False
            c.lift(tmpl.k, float(a))
            parts.append(_scalar_part(a, func))
        else:  # a literal: only record's inline kinds, equal to the template's
            if ta is list or ta is tuple:
                if not all(type(x) is int for x in a):
                    return False  # (before comparing: a proxy in a list must not be compared)
            elif ta not in SCALARS:
                return False
            if type(tmpl) is not ta or tmpl != a:
                return False
    return True


def _scalar_part(a, func):
    """A lifted scalar's part of the cache key (as record builds it)."""
    return ANY_FLOAT if type(a) is float and floats_free(func) else (type(a), a)


def varying(cls, e, args, kwargs, func) -> tuple:
    """The parts of an op's cache key a plan entry's template leaves free: its tensors'
    (proxies of class ``cls``) metadata and its lifted scalars' (the template's literals fix
    the rest)."""
    parts = []
    for tmpl, a in zip(e.args, args):  # noqa: B905 (the entry matched these arguments)
        if type(a) is cls:
            parts.append(a.gt_meta_key)
        elif type(tmpl) is Scalar:
            parts.append(_scalar_part(a, func))
    for k, v in kwargs.items():
        if type(e.kwargs.get(k)) is Scalar:
            parts.append(_scalar_part(v, func))
    return tuple(parts)


_MISSING = object()
