"""Events folded into each hot path's data, one handler per event type (see report.summarize).

A :class:`Fold` reads a session's events in order. ``since`` starts the view of one cell:
earlier events still give each hot path its status, ops and graph (and the eager timings a
baseline may need); runs, timings and counters count from ``since`` on. No torch import here.
"""

from __future__ import annotations

from gt_core.observe import events as ev
from gt_core.observe.causes import explain
from gt_core.observe.status import Status, enter

__all__ = ["Fold", "COUNTERS", "new_path"]

# The client's counters (a ``stats`` event's; gt_core.client.session): cumulative, so a view
# counts from the last ones before it.
COUNTERS = ("ops", "frees", "syncs", "uploads", "fetches")
COUNTERS += ("bytes_up", "up_ms", "bytes_down", "down_ms")  # data moved (metrics.data)
# What happened before a cell still decides a hot path's state; its runs and counters do not.
_RUNS = frozenset({ev.ITERATION, ev.MISMATCH, ev.STATS, ev.FOLDED})
_SYNC_CUTS = frozenset({"sync point", "end of stream"})
_CLIENT = frozenset({ev.JIT, ev.JIT_STATS, ev.CLIENT_STATS})


def new_path(signature: str) -> dict:
    """A hot path's data before any of its events."""
    return {
        "signature": signature,
        "status": Status.RECORDING,
        "states": [],  # [state, t]: each state as it was entered (status.enter)
        "options": {},  # what its compile was asked for: backend, mode, dynamic
        "judged": None,  # the regression check's comparison: {"eager_ms", "compiled_ms"}
        # Its compiled block's verdict (the judge's, or a failed check's): {"t", "runs"}, runs
        # from its compiled function's arrival to the verdict; None until one.
        "settled": None,
        "ops": [],
        "n_ops": 0,
        "occurrences": 0,
        "compiled_runs": 0,
        "eager_runs": 0,
        "compile_seconds": None,
        "compile_cache": None,  # where its compiled block came from (report.COMPILE_CACHE)
        "cudagraphs": None,  # on a GPU with a CUDA-graph mode: "used" or "skipped"
        "cudagraph_skips": [],  # inductor's reasons when skipped
        "cudagraph_explanations": [],  # each reason's {"id", "cause", "fix"} (gt_core.observe.causes)
        "recompile_reasons": [],
        "recompile_changes": [],  # per recompile, observe.graph.Change's data (or None)
        "fallback_reason": None,
        # Matched no more: {"reason", "by" (the longer hot path that runs it, or None)}
        "retired": None,
        # Its first compiled run against its eager graph: {"ok", "what", "diff", "tolerance"}
        # (or {"skipped": why}); None until a compiled run (gt_core.hotpath.numerics).
        "checked": None,
        "notes": [],  # what some runs did, said once (e.g. run eagerly: inputs shared memory)
        # eager_ms: the baseline; client_ms: the client's ms per occurrence (its Python and
        # recording; for a gt_core.jit step, a replayed call)
        "timings": {"eager_ms": [], "compiled_ms": [], "client_ms": None},
        # Eager runs while a compile shared the worker's CPU: slower, kept out of the baseline.
        "compiling_ms": [],
        "timed_runs": 0,  # runs whose timings the medians read (the rest are folded)
        "mismatches": 0,
        "sync_cuts": 0,  # mismatches where a sync point (or the stream's end) cut a run short
        "detected_at": None,
        "compiled_at": None,
        "jit": None,  # the gt_core.jit function whose calls are this block
        "replayed_runs": 0,  # calls replayed without running the function's Python
        "frozen_scalars": [],  # Python numbers a replay keeps as recorded: {op, arg, value}
        "replay_refused": None,  # why calls are not replayed (the function runs instead)
    }


def _enter(p: dict, state: Status, t) -> None:
    """The hot path is in ``state`` from ``t`` on, unless it was retired: that is final (a
    compile of it may still finish, or fail, afterwards) but for its own revival (REVIVED)."""
    if p["status"] != Status.RETIRED:
        p["status"] = state
        enter(p["states"], state, t)


def _check(e: dict) -> dict:
    """A numerical check's outcome as the report keeps it."""
    if e.get("skipped"):
        return {"skipped": e["skipped"]}
    keep = ("what", "diff", "bound")
    return {"ok": e["type"] == ev.CHECKED, **{k: e.get(k) for k in keep}}


class Fold:
    """The hot paths, counters and worker state a list of events adds up to."""

    def __init__(self, since: int = 0):
        self.since = since
        self.paths: dict[str, dict] = {}
        self.stats = dict.fromkeys(COUNTERS, 0)
        self.base = dict(self.stats)  # the counters when the view starts
        self.worker: dict = {}
        self.active: set[str] = set()  # hot paths with events in the view
        self.earlier: dict[tuple, list[float]] = {}  # (sig, kind) -> eager ms before the view

    def path(self, sig: str) -> dict:
        if sig not in self.paths:
            self.paths[sig] = new_path(sig)
        return self.paths[sig]

    def feed(self, i: int, e: dict) -> None:
        """Fold event ``e``, the ``i``-th of the session."""
        t, sig = e.get("type"), e.get("signature")
        if i < self.since and t in _RUNS:
            self._before_view(e, t, sig)
            return
        if i >= self.since and sig is not None:
            self.active.add(sig)
        handler = _HANDLERS.get(t)
        if handler is not None:
            handler(self, e, sig, i)

    def _before_view(self, e: dict, t: str, sig) -> None:
        if t == ev.FOLDED and e.get("of") == ev.STATS:
            e, t = e["last"], ev.STATS
        if t == ev.STATS:
            self.base.update({k: e[k] for k in self.base if k in e})
        elif t == ev.ITERATION and e.get("kind") in ("eager", "compiling"):
            self.earlier.setdefault((sig, e["kind"]), []).append(e["ms"])  # view's baselines

    # -- one handler per event type (_HANDLERS) ----------------------------------------------
    def _stats(self, e, sig, i) -> None:
        if e.get("base"):  # a log's counters when it was opened
            self.base.update({k: e[k] for k in self.base if k in e})
        self.stats.update({k: e[k] for k in self.stats if k in e})

    def _recording(self, e, sig, i) -> None:
        p = self.path(sig)
        if p["status"] == Status.RECORDING:
            p.update(ops=list(e.get("ops", [])), n_ops=e.get("n_ops", 0))
            enter(p["states"], Status.RECORDING, e.get("t"))

    def _detected(self, e, sig, i) -> None:
        p = self.path(sig)
        if e.get("recording_t") is not None:
            enter(p["states"], Status.RECORDING, e["recording_t"])
        p.update(status=Status.HOT, ops=list(e.get("ops", [])), n_ops=e.get("n_ops", 0))
        enter(p["states"], Status.HOT, e.get("t"))
        p["detected_at"] = e.get("t")
        if i >= self.since:  # (its occurrences ran before the view: not the view's runs)
            p["occurrences"] = max(p["occurrences"], e.get("occurrences", 0))

    def _known(self, e, sig, i) -> None:
        p = self.path(sig)
        if p["status"] != Status.RECORDING:  # (its events since are the newer word)
            return
        p.update(ops=list(e.get("ops", [])), n_ops=e.get("n_ops", 0))
        _enter(p, Status(e.get("status", Status.HOT.value)), e.get("t"))

    def _compile_started(self, e, sig, i) -> None:
        p = self.path(sig)
        p["options"] = {k: e[k] for k in ("backend", "mode", "dynamic") if k in e}

    def _compile_finished(self, e, sig, i) -> None:
        p = self.path(sig)
        p.update(
            compile_seconds=e.get("seconds"),
            compile_cache=e.get("cache"),
            compiled_at=e.get("t"),
            cudagraphs=e.get("cudagraphs"),
            cudagraph_skips=list(e.get("cudagraph_skips") or []),
        )
        p["cudagraph_explanations"] = [explain("cudagraph_skip", r) for r in p["cudagraph_skips"]]

    def _failed(self, e, sig, i) -> None:
        p = self.path(sig)
        p["fallback_reason"] = e.get("reason")

    def _verdict(self, e, sig, i) -> None:  # (a kept block's runs go on compiled)
        p = self.path(sig)
        p["judged"] = {"eager_ms": e.get("eager_ms"), "compiled_ms": e.get("compiled_ms")}
        p["settled"] = {"t": e.get("t"), "runs": e.get("runs")}
        if e["type"] == ev.REVERT:
            p["fallback_reason"] = e.get("reason")

    def _check_failed(self, e, sig, i) -> None:
        p = self.path(sig)
        p.update(fallback_reason=e.get("reason"), checked=_check(e))
        p["settled"] = {"t": e.get("t"), "runs": e.get("runs")}

    def _cancelled(self, e, sig, i) -> None:
        p = self.path(sig)
        p["notes"].append(f"compile cancelled after {e.get('seconds', 0):.1f} s: {e.get('reason')}")

    def _retired(self, e, sig, i) -> None:
        p = self.path(sig)
        _enter(p, Status.RETIRED, e.get("t"))
        p["retired"] = {"reason": e.get("reason"), "by": e.get("by")}

    def _revived(self, e, sig, i) -> None:
        p = self.path(sig)
        p["status"], p["retired"] = Status(e.get("status", Status.HOT.value)), None
        enter(p["states"], p["status"], e.get("t"))

    def _state(self, e, sig, i) -> None:
        """A move on the worker (ev.STATE): the hot path is in that state from then on."""
        _enter(self.path(sig), Status(e["status"]), e.get("t"))

    def _checked(self, e, sig, i) -> None:
        self.path(sig)["checked"] = _check(e)

    def _note(self, e, sig, i) -> None:
        self.path(sig)["notes"].append(e.get("reason", ""))

    def _recompile(self, e, sig, i) -> None:
        p = self.path(sig)
        p["recompile_reasons"].append(e.get("reason", ""))
        p["recompile_changes"].append(e.get("change"))  # (typed: what the advice reads)

    def _mismatch(self, e, sig, i) -> None:
        if sig not in self.paths:
            return  # a block known only before a reset(): nothing to show it against
        p = self.paths[sig]
        p["mismatches"] += 1
        if e.get("got") in _SYNC_CUTS:
            p["sync_cuts"] += 1

    def _iteration(self, e, sig, i) -> None:
        p = self.path(sig)
        p["occurrences"] += 1
        p["timed_runs"] += 1
        if e.get("kind") == "compiled":
            p["compiled_runs"] += 1
            p["timings"]["compiled_ms"].append(e["ms"])
        else:
            p["eager_runs"] += 1
            during = e.get("kind") == "compiling"
            (p["compiling_ms"] if during else p["timings"]["eager_ms"]).append(e["ms"])

    def _client(self, e, sig, i) -> None:
        """What the client says of a hot path: gt_core.jit's state and counts, its ms."""
        sig, t = e.get("signature"), e["type"]
        # Counts and timings annotate a hot path the report knows; only jit's own state (its
        # block registered just before) names one it may not have seen yet.
        replaying = t == ev.JIT and e.get("state") == "replaying"
        if sig is None or (sig not in self.paths and not replaying):
            return
        p = self.path(sig)
        if t == ev.JIT:
            p["jit"] = e.get("function")
            if replaying:
                p["frozen_scalars"], p["replay_refused"] = list(e.get("frozen", [])), None
            elif e.get("state") == "refused":
                p["replay_refused"] = e.get("reason")
        elif t == ev.JIT_STATS:
            p["jit"] = e.get("function")
            p["replayed_runs"] = e.get("replayed", 0)
            if e.get("client_ms") is not None:
                p["timings"]["client_ms"] = e["client_ms"]
        elif p["jit"] is None and e.get("client_ms") is not None:  # CLIENT_STATS
            p["timings"]["client_ms"] = e["client_ms"]

    def _folded(self, e, sig, i) -> None:
        """A fold of per-step events: its runs, its mismatches, its last counters."""
        of, counts = e.get("of"), e.get("counts", {})
        if of in _CLIENT:
            self._client(e["last"], sig, i)
        elif of == ev.STATS:
            self.stats.update({k: e["last"][k] for k in self.stats if k in e["last"]})
        elif of == ev.ITERATION:
            p = self.path(sig)
            p["occurrences"] += e["n"]
            n = counts.get("compiled", 0)
            p["compiled_runs"] += n
            p["eager_runs"] += e["n"] - n
        elif of == ev.MISMATCH and sig in self.paths:  # (else known only before a reset())
            p = self.paths[sig]
            p["mismatches"] += e["n"]
            p["sync_cuts"] += sum(counts.get(g, 0) for g in _SYNC_CUTS)

    def _worker(self, e, sig, i) -> None:
        self.worker = {k: v for k, v in e.items() if k not in ("type", "t")}
        if e.get("state") != "died":
            return
        for p in self.paths.values():  # its compiles in flight died with it
            if p["status"] in (Status.HOT, Status.COMPILING):
                why = f"the worker died ({e.get('cause')}) before this hot path was compiled"
                p.update(status=Status.FAILED, fallback_reason=why)
                enter(p["states"], Status.FAILED, e.get("t"))


_HANDLERS = {
    ev.STATS: Fold._stats,
    ev.RECORDING: Fold._recording,
    ev.DETECTED: Fold._detected,
    ev.STATE: Fold._state,
    ev.COMPILE_STARTED: Fold._compile_started,
    ev.COMPILE_FINISHED: Fold._compile_finished,
    ev.COMPILE_FAILED: Fold._failed,
    ev.COMPILE_CANCELLED: Fold._cancelled,
    ev.FALLBACK: Fold._failed,
    **dict.fromkeys(ev.VERDICTS, Fold._verdict),
    ev.CHECK_FAILED: Fold._check_failed,
    ev.CHECKED: Fold._checked,
    ev.RETIRED: Fold._retired,
    ev.REVIVED: Fold._revived,
    ev.KNOWN: Fold._known,
    ev.NOTE: Fold._note,
    ev.CACHE_EVICTED: Fold._note,
    ev.RECOMPILE: Fold._recompile,
    ev.MISMATCH: Fold._mismatch,
    ev.ITERATION: Fold._iteration,
    **dict.fromkeys(_CLIENT, Fold._client),
    ev.FOLDED: Fold._folded,
    ev.WORKER: Fold._worker,
}
