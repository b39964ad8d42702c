"""Our hook on Dynamo's per-call stance: it names the compiled function being entered, and
runs compiled functions eagerly on threads that gt is capturing.

Every call of a ``torch.compile``'d function asks ``torch._dynamo.eval_frame.
_callback_from_stance(callback)`` which frame callback to run under; ``None`` means "run the
Python as it is". While :func:`hooked` is active (diagnostics, or a capture), our wrapper
sits in front of it. It is installed once however many users there are, and the original is
put back when the last one leaves.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Callable

from gt_core.diagnostics import torch_hooks as hooks
from gt_core.diagnostics.compiled import codes_of, display_name

__all__ = [
    "hooked",
    "routing",
    "observing",
    "owner_of",
    "entry_name",
    "entered",
    "display_name",
    "in_worker",
]


class _InWorker(threading.local):
    active = False  # gt's in-process worker runs in this thread (client.inprocess._isolated)

    @contextlib.contextmanager
    def running(self):
        """Inside, gt's in-process worker runs in this thread."""
        was, self.active = self.active, True
        try:
            yield
        finally:
            self.active = was


# Set while gt's own worker code runs in the client's process: the user's hooks (a seed, a
# compiled function's routing, a compile watched) are not for it.
in_worker = _InWorker()

_lock = threading.Lock()
# observer: called at each call of a compiled function not routed (see observing)
_state = {"users": 0, "original": None, "observer": None}
_local = threading.local()  # .entry: the name of the compiled function entered last
# id -> (a weak reference, its display name, the code objects Dynamo compiles for it) of each
# compiled function entered while the hook was in, in order of first entry: diagnostics reads
# the cache entries on those codes as a block ends
_entered: dict[int, tuple] = {}
# (name, codes) of those gone since: a function compiled inside a block may die before the
# block ends, while its cache entries live on in its code (a nested function's code is a
# constant of its parent's); kept until the hook's last user leaves
_gone: list[tuple[str, list]] = []
# thread id -> [(on_routed(name), skip()), ...] while that thread is inside gt_core.capture()
_routes: dict[int, list] = {}


def entered() -> list[tuple[str, list]]:
    """(display name, code objects) of each compiled function entered while the hook was in,
    alive or gone since."""
    with _lock:
        alive = [(name, codes) for ref, name, codes in _entered.values() if ref() is not None]
        return alive + list(_gone)


def owner_of(filename: str, co_name: str, firstlineno: int) -> str | None:
    """The display name of the compiled function entered whose own code this is (a record's
    ``co_*`` fields), or None: a module's ``forward`` under a decorator of its library
    compiles as the decorator's code (``wrapper``), and is named by what the user compiled."""
    with _lock:
        records = [(name, codes) for _, name, codes in _entered.values()] + list(_gone)
    for name, codes in records:
        for code in codes:
            where = (code.co_filename, code.co_name, code.co_firstlineno)
            if where == (filename, co_name, firstlineno):
                return name
    return None


def _forget(key: int):
    """The callback that moves a compiled function's record to the gone once it dies."""

    def forget(_) -> None:
        record = _entered.pop(key, None)
        if record is not None:
            _gone.append(record[1:])

    return forget


def _codes_of(fn) -> list:
    try:
        return codes_of(fn)[1]
    except Exception:  # not a function Dynamo compiles code of: nothing to read
        return []


def entry_name() -> str | None:
    """The compiled function this thread entered last (None if none since the hook went in)."""
    return getattr(_local, "entry", None)


def _hook(callback):
    original = _state["original"]
    if callback is None or callback is False:
        return original(callback)
    name = fn = None
    frame = sys._getframe(1)  # the caller: Dynamo's wrapper
    try:
        fn = hooks.compiled_fn_of(frame)
        name = display_name(fn) if fn is not None else None
        _local.entry = name
        record = _entered.get(id(fn))
        if fn is not None and (record is None or record[0]() is not fn):
            codes = _codes_of(fn)
            with _lock:
                _entered[id(fn)] = (weakref.ref(fn, _forget(id(fn))), name, codes)
    except Exception:  # naming is a nicety; never let it break the call
        pass
    routes = _routes.get(threading.get_ident())
    if routes:
        on_routed, skip = routes[-1]
        if not skip():
            on_routed(name or "?")
            return None  # run the function's Python eagerly: its ops reach gt's stream
    observer = _state["observer"]
    if observer is not None and observer(name or "?", fn, frame):
        return None  # this call runs eagerly: a sample the compiled calls are measured against
    return original(callback)


def _install() -> None:
    with _lock:
        if _state["users"] == 0:
            _state["original"] = hooks.stance_callback()
            hooks.set_stance_callback(_hook)
        _state["users"] += 1


def _uninstall() -> None:
    with _lock:
        _state["users"] -= 1
        if _state["users"] == 0:
            if hooks.stance_callback() is _hook:
                hooks.set_stance_callback(_state["original"])
            _gone.clear()
            # "original" stays: a call that looked the hook up just before still needs it


@contextlib.contextmanager
def hooked():
    """Keep our hook in front of Dynamo's stance while the block runs."""
    _install()
    try:
        yield
    finally:
        _uninstall()


@contextlib.contextmanager
def routing(on_routed: Callable[[str], None], skip: Callable[[], bool]):
    """On this thread, compiled functions run eagerly while the block runs.

    ``on_routed(name)`` is called at each such call; ``skip()`` True exempts a call (gt's own
    in-process worker code, which compiles hot paths on purpose).
    """
    tid = threading.get_ident()
    with hooked():
        _routes.setdefault(tid, []).append((on_routed, skip))
        try:
            yield
        finally:
            stack = _routes.get(tid, [])
            if stack:
                stack.pop()
            if not stack:
                _routes.pop(tid, None)


@contextlib.contextmanager
def observing(observer: Callable[[str, object, object], bool]):
    """Call ``observer(name, fn, frame)`` at each call of a compiled function while the block
    runs (``frame``: Dynamo's wrapper's); True runs that call's Python eagerly. Calls that a
    capture routes are not observed: they run through gt's stream."""
    with hooked():
        _state["observer"] = observer
        try:
            yield
        finally:
            _state["observer"] = None
