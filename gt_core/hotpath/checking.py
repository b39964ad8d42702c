"""A compiled block's first run, checked against its eager graph (see gt_core.hotpath.numerics)."""

from __future__ import annotations

import math

from gt_core.hotpath import numerics
from gt_core.hotpath.blocks import Block, Occurrence
from gt_core.hotpath.outbox import reason
from gt_core.observe import events as ev
from gt_core.observe.report import Status

__all__ = ["run_checked"]


def run_checked(runner, block: Block, occ: Occurrence, fn, inputs: list) -> None:
    """A compiled block's first run: checked against its eager graph (see numerics).

    The eager graph runs first on copies of the inputs (and in float64 on others, the
    oracle), the generators set back after each; then the compiled block on the inputs.
    Where the compiled values fail the check, or the compiled run raises, the inputs take
    the eager run's values, its outputs are bound, and the block runs eagerly from then on.
    """
    block.checking()
    eager = block.eager_fn
    if eager is None:
        runner.outbox.emit(ev.CHECKED, signature=block.sig, skipped="the block has no eager graph")
        runner.run_compiled(block, occ, fn, inputs)
        return
    dev = runner.ex.device
    rng = numerics.rng_state(dev)
    saved = numerics.Copies(inputs)
    want = _eager_on_copies(runner, block, occ, eager, saved, rng)
    if want is None:
        return
    after = numerics.rng_state(dev)
    oracle = _oracle(runner.ex, eager, inputs, occ, rng)
    numerics.set_rng_state(dev, rng)
    verdict = None
    threads = None
    try:
        got, ms, threads = runner.call_compiled(block, occ, fn, inputs)
        pairs = _pairs(block, [*got, *inputs], [*want, *saved.tensors], oracle)
        verdict = numerics.compare(pairs)
        why = verdict.words()
        if verdict.ok and not numerics.same_rng(numerics.rng_state(dev), after):
            verdict = numerics.Verdict(False, "the random generator's state", math.inf, 0.0)
            why = (
                "the compiled block leaves the random generator in another state than eager "
                "does (it draws its random numbers otherwise): later random ops would differ"
            )
    except Exception as exc:  # the compiled run (or the comparison) raised
        why = f"its first compiled run raised: {reason(exc)}"
    verdict, why = _agreed(runner, verdict, why)
    if verdict is None or not verdict.ok:
        saved.restore()  # (the compiled run's writes undone: eager's values are kept)
        numerics.set_rng_state(dev, after)
        block.move(Status.REVERTED)
        fields = {} if verdict is None else verdict._asdict()
        fields.pop("ok", None)
        runner.outbox.emit(
            ev.CHECK_FAILED, signature=block.sig, reason=why, runs=block.runs_to_settle(), **fields
        )
        runner.bind(block, occ, want)
        return
    fields = {k: v for k, v in verdict._asdict().items() if k != "ok"}
    runner.outbox.emit(ev.CHECKED, signature=block.sig, **fields)
    runner.bind(block, occ, got)
    runner.timings.then(ms, lambda ms: runner.judge.compiled_ran(block, ms, threads))


def _eager_on_copies(runner, block: Block, occ: Occurrence, eager, saved, rng):
    """The eager graph's outputs on copies of the inputs (``saved``), or None where it raised:
    then the block has failed and its instructions ran the occurrence (they say which op)."""
    try:
        want = eager(*saved.tensors, *occ.scalars)
    except Exception:  # the eager run proper says what failed, op by op
        numerics.set_rng_state(runner.ex.device, rng)
        block.move(Status.FAILED, eager_too=True)
        why = "its eager graph raised on copies of its inputs: its instructions run it"
        runner.outbox.emit(ev.FALLBACK, signature=block.sig, reason=why)
        runner.run_instructions(occ.instructions)
        return None
    block.eager_graph_ran()
    return want


def _agreed(runner, verdict, why: str):
    """(verdict, why) as every rank of a worker group sees it: one rank's failed check fails
    it on all, at this same run (one worker: as it is)."""
    if runner.agree(verdict is not None and verdict.ok) or verdict is None or not verdict.ok:
        return verdict, why
    why = "its first compiled run failed the check on another rank of the worker group"
    return verdict._replace(ok=False), why


def _oracle(ex, eager, inputs, occ: Occurrence, rng) -> list | None:
    """The eager graph's outputs and inputs after a run in float64, or None where it
    cannot run so (see numerics)."""
    numerics.set_rng_state(ex.device, rng)
    try:
        wide = numerics.Copies(inputs, upcast=True)
        with numerics.Wide():
            out = eager(*wide.tensors, *occ.scalars)
        return [*out, *wide.tensors]
    except Exception:
        return None


def _pairs(block: Block, got: list, want: list, oracle: list | None):
    """(what, compiled, eager, float64 oracle) of every output, then of every input."""
    makers = _makers(block)
    n = len(block.form.canon.outputs)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        what = (
            f"output {k} ({makers.get(block.form.canon.outputs[k], 'an op')})"
            if k < n
            else f"input in{k - n}, written in place"
        )
        yield what, g, w, None if oracle is None else oracle[k]


def _makers(block: Block) -> dict:
    """Each value name of the block -> the op that made it, as words."""
    out, k = {}, 0
    for e in block.form.canon.entries:
        if e.kind != "op":
            continue
        for name in e.outs:
            if name is not None:
                out[name] = f"{e.op}, op {k} of the block"
        k += 1
    return out
