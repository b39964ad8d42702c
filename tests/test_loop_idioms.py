"""Generated training loops (tests/idioms.py) through gt and gt_core.jit, eager the oracle.

gt may refuse to replay, or run the Python instead, if it says so; it never gives another
number than eager's without a word. Each loop runs three ways (eager, plain gt, jit) on the
in-process worker, then plain gt again on the worker the jitted run left ("again": a
notebook's cell run once more without the decorator, its blocks known), and is classed per
way: equal, refused (a jit event says why the Python ran: still equal to eager), silent
(another number, no word) or error (it raised).

The CI sample is a fixed hypothesis draw (derandomized, no database); ``GT_IDIOMS=N`` runs
N more loops in the ``idioms_large`` test (deselected by default). Each prints its summary.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import time
from dataclasses import dataclass

import hypothesis
import pytest
import torch
from conftest import use_inprocess
from hypothesis import HealthCheck, Phase, given, settings
from idioms import TOL, WAYS, LoopSpec, Outcome, Verdict, classify, loops, run, spread

import gt_core
from gt_core.client import capture as _capture

CI_LOOPS = 110
DRAWS = 10  # hypothesis draws per loop run: the sample is spread over them
LARGE_LOOPS = int(os.environ.get("GT_IDIOMS") or 0)  # GT_IDIOMS=1000: the large test runs
# Calls that run the Python by the contract, whatever the step: the first makes what no later
# call makes (optimizer state), the second and third record the block alike, and the first
# replay is audited (recorded and compared). Replay can count from the fifth call.
WARMUP = 4
# Calls the contract spends when the loop changes a number the step reads (LoopSpec.knob):
# the call that sees the change records, and the first replay after is audited; a threshold
# crossed takes two recordings of the new path.
KNOB_CALLS = {"none": 0, "scale": 2, "decay": 2, "branch": 3}
# The target: 80% of the loops replay 90% of the calls they can (those after WARMUP). The
# bar asserted is the target; the code meets more (90% of the CI sample with a Python
# number changed by 3 loops in 5, 2026-12-02; before that dimension: 87% of a thousand loops
# of seed 1).
TARGET_SHARE, TARGET_LOOPS = 0.9, 0.8
ASSERTED_LOOPS = TARGET_LOOPS


def sample(n: int, seed: int | None = None) -> list[LoopSpec]:
    """``n`` distinct loops, the same ones every run: spread over DRAWS * n hypothesis draws
    (derandomized, or from ``seed``)."""
    drawn: list[LoopSpec] = []

    @settings(
        max_examples=DRAWS * n,
        derandomize=seed is None,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(loops())
    def draw(spec):
        drawn.append(spec)

    if seed is not None:
        draw = hypothesis.seed(seed)(draw)
    draw()
    return spread(drawn, n)


@dataclass
class Result:
    """One loop's three ways, classed against eager."""

    spec: LoopSpec
    gt: Verdict
    jit: Verdict
    jitted: Outcome
    seconds: float
    again: Verdict  # plain gt on the worker the jitted loop left (a notebook's second run)

    @property
    def share(self) -> float:
        """Replayed calls of those that can replay (after WARMUP, and those a change of a
        number the step reads spends: KNOB_CALLS)."""
        can = self.spec.calls - WARMUP - KNOB_CALLS[self.spec.knob]
        return min(1.0, self.jitted.replayed / max(1, can))

    @property
    def bad(self) -> list[tuple[str, Verdict]]:
        """(way, verdict) for each way that gave a number without a word, or an unclear error."""
        return [
            (way, v)
            for way, v in (("gt", self.gt), ("jit", self.jit), ("again", self.again))
            if v.kind in ("silent", "invalid") or (v.kind == "error" and not v.clear)
        ]


def run_loop(spec: LoopSpec) -> Result:
    t0 = time.perf_counter()
    got = {way: run(spec, way) for way in WAYS}  # (jit last: "again" runs on its worker)
    gt, jit = classify(got["eager"], got["gt"]), classify(got["eager"], got["jit"])
    again = classify(got["eager"], run(spec, "gt", fresh=False))
    return Result(spec, gt, jit, got["jit"], time.perf_counter() - t0, again)


def summary(results: list[Result], seconds: float) -> str:
    """Counts per class and way, the replay share, and every loop that is not equal."""
    lines = [f"{len(results)} loops in {seconds:.0f} s"]
    for way in ("gt", "jit", "again"):
        counts = collections.Counter(getattr(r, way).kind for r in results)
        lines.append(f"  {way:5}: " + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    met = sum(r.share >= TARGET_SHARE for r in results)
    replayed = sum(r.jitted.replayed for r in results)
    calls = sum(r.spec.calls for r in results)
    lines.append(
        f"  replay: {met}/{len(results)} loops ({met / max(1, len(results)):.0%}) replay "
        f">= {TARGET_SHARE:.0%} of the calls after the first {WARMUP} (and after a change of "
        "a number the step reads, those the contract spends) "
        f"(target {TARGET_LOOPS:.0%} of loops); {replayed}/{calls} calls replayed in all"
    )
    for way in ("gt", "jit", "again"):
        offs = [
            getattr(r, way).off for r in results if getattr(r, way).kind in ("equal", "refused")
        ]
        if offs:
            lines.append(
                f"  {way:5}: largest difference where equal: {max(offs):.2g} (TOL {TOL:g})"
            )
    for kind in ("invalid", "error", "silent", "refused"):
        for way in ("gt", "jit", "again"):
            hit = [r for r in results if getattr(r, way).kind == kind]
            if hit:
                lines.append(f"-- {way} {kind}: {len(hit)}")
                lines += [f"  {r.spec.short()}\n    {getattr(r, way)}" for r in hit]
    return "\n".join(lines)


@pytest.fixture(scope="module")
def idioms_worker():
    """The in-process worker (as the ``inprocess`` fixture) for a module's loops; one intra-op
    thread in the kernel and the worker, so eager and the worker reduce in the same order
    (and a loaded two-core machine does not spin threads against each other)."""
    saved, threads = _capture._options(), torch.get_num_threads()
    torch.set_num_threads(1)
    use_inprocess(worker_threads=1)
    yield
    gt_core.worker().stop()
    torch.set_num_threads(threads)
    with _capture._lock:
        _capture._state["options"] = saved
        _capture._apply_log(saved)


def _run_sample(specs: list[LoopSpec]) -> tuple[list[Result], str]:
    t0 = time.perf_counter()
    results = [run_loop(spec) for spec in specs]
    return results, summary(results, time.perf_counter() - t0)


@pytest.fixture(scope="module")
def ci_sample(idioms_worker):
    return _run_sample(sample(CI_LOOPS))


def test_the_ci_sample_prints_its_summary(ci_sample, capsys):
    results, text = ci_sample
    with capsys.disabled():
        print("\n" + text)
    assert len(results) >= 100
    assert not [r for r in results if r.gt.kind == "invalid"], "a generated loop eager refuses"


def test_no_generated_loop_gives_another_number_without_a_word(ci_sample):
    results, text = ci_sample
    assert not [r for r in results if r.bad], text


def test_the_ci_sample_replays(ci_sample):
    results, text = ci_sample
    met = sum(r.share >= TARGET_SHARE for r in results)
    # Target: TARGET_LOOPS of the loops replay TARGET_SHARE of their calls after WARMUP.
    assert met >= ASSERTED_LOOPS * len(results), text


@pytest.mark.idioms_large
@pytest.mark.skipif(not LARGE_LOOPS, reason="GT_IDIOMS=1000 runs a thousand loops (an hour)")
def test_a_thousand_generated_loops(idioms_worker, capsys):
    """GT_IDIOMS loops drawn from GT_IDIOMS_SEED (1 unless set): other loops than CI's."""
    results, text = _run_sample(sample(LARGE_LOOPS, seed=int(os.environ.get("GT_IDIOMS_SEED", 1))))
    with capsys.disabled():
        print("\n" + text)
    assert not [r for r in results if r.bad], text
    assert sum(r.share >= TARGET_SHARE for r in results) >= TARGET_LOOPS * len(results), text


# -- regressions: loops found wrong, each as the user wrote it -------------------------------
def _three_ways(spec: LoopSpec) -> Result:
    r = run_loop(spec)
    assert r.gt.kind != "invalid", r.gt
    assert r.gt.kind == "equal" and r.jit.kind in ("equal", "refused"), (r.gt, r.jit)
    return r


TRAINER_STEPLR = LoopSpec(
    location="trainer",
    optimizer="SGD",
    opt_args=(("lr", 0.05), ("momentum", 0.9)),
    schedule="StepLR",
    sched_args=(("step_size", 10), ("gamma", 0.5)),
    calls=40,
)


@pytest.mark.parametrize(
    "sched_inside",
    [
        pytest.param(False, id="trainer.sched.step()-after-each-call"),
        pytest.param(True, id="self.sched.step()-ending-the-step"),
    ],
)
def test_a_trainer_with_sgd_momentum_and_steplr_equals_eager(idioms_worker, sched_inside):
    _three_ways(dataclasses.replace(TRAINER_STEPLR, sched_inside=sched_inside))


BERT_DICT_BATCHES = LoopSpec(
    model="bert",
    data="loader-dict",
    schedule="get_linear_schedule_with_warmup",
    sched_args=(("num_warmup_steps", 4), ("num_training_steps", 32)),
    calls=32,
)


@pytest.mark.parametrize(
    "lr_tensor",
    [
        pytest.param(False, id="AdamW()"),
        pytest.param(True, id="AdamW(lr=torch.tensor(1e-3))"),
    ],
)
def test_bert_fine_tuned_from_dict_batches_with_linear_warmup_equals_eager_and_replays(
    idioms_worker, lr_tensor
):
    spec = dataclasses.replace(BERT_DICT_BATCHES, lr_tensor=lr_tensor)
    r = _three_ways(spec)
    assert r.jitted.replayed >= spec.calls // 2, r.jitted.reasons


ADAMW_GROUPS_COSINE_BY_HAND = LoopSpec(
    groups=True,
    schedule="manual-lr",
    sched_args=(("warmup", 0), ("total", 40)),
    calls=40,
)


def test_adamw_decay_groups_with_a_cosine_lr_written_each_call_equal_eager_and_replay(
    idioms_worker,
):
    r = _three_ways(ADAMW_GROUPS_COSINE_BY_HAND)
    assert r.jitted.replayed >= 0.9 * ADAMW_GROUPS_COSINE_BY_HAND.calls, r.jitted.reasons


ACCUMULATED_OUTSIDE = LoopSpec(
    optimizer="Adam", accum=3, accum_inside=False, clip=True, zero_grad="start", calls=12
)


@pytest.mark.parametrize("accum", [2, 3])
@pytest.mark.parametrize("set_to_none", [True, False], ids=["set_to_none", "zeroed"])
def test_grads_accumulated_over_calls_replay_one_block_equal_to_eager(
    idioms_worker, set_to_none, accum
):
    """The step's backward runs per micro-batch, the optimizer steps outside every third
    call: after zero_grad(set_to_none=True) the first micro-batch finds no .grad, the others
    add to one. One block serves both (the replay fills the empty grads with zeros)."""
    spec = dataclasses.replace(ACCUMULATED_OUTSIDE, set_to_none=set_to_none, accum=accum)
    r = _three_ways(spec)
    assert r.share >= TARGET_SHARE, r.jitted.reasons


LSTM_LM = LoopSpec(model="lstm", optimizer="SGD", opt_args=(("lr", 0.5),))


def test_an_lstm_language_model_through_gt_and_jit_equals_eager(idioms_worker):
    _three_ways(LSTM_LM)


ONE_CYCLE_SGD = LoopSpec(
    optimizer="SGD",
    opt_args=(("lr", 0.05), ("momentum", 0.9)),
    schedule="OneCycleLR",
    sched_args=(("max_lr", 0.5), ("total_steps", 8)),
    calls=8,
)
ADADELTA_BN_WARMUP = LoopSpec(
    seed=3,
    norm="BatchNorm1d",
    dropout=True,
    depth=2,
    optimizer="Adadelta",
    groups=True,
    schedule="LambdaLR",
    sched_args=(("warmup", 3),),
    accum=3,
    clip=True,
)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(ONE_CYCLE_SGD, id="sgd-onecycle"),  # (the jit's block tracked plain ops)
        pytest.param(ADADELTA_BN_WARMUP, id="adadelta-batchnorm-warmup"),  # (its lifted lr)
    ],
)
def test_a_loop_run_with_jit_then_without_in_one_session_equals_eager(idioms_worker, spec):
    """A notebook's habit: the step jitted, then the decorator taken out and the cell run
    again. The second run is plain gt on the worker the first left."""
    eager = run(spec, "eager")
    assert classify(eager, run(spec, "jit")).kind in ("equal", "refused")
    again = classify(eager, run(spec, "gt", fresh=False))
    assert again.kind == "equal", again


ADAM_FAMILY_AT_A_HIGH_LR = [
    LoopSpec(
        seed=3,
        model="embedding",
        norm="LayerNorm",
        depth=2,
        optimizer="AdamW",
        opt_args=(("lr", 0.003), ("weight_decay", 0.1)),
        schedule="OneCycleLR",
        sched_args=(("max_lr", 0.03), ("total_steps", 8)),
        zero_grad="start",
        set_to_none=False,
        calls=8,
    ),
    LoopSpec(
        seed=3,
        model="bert",
        optimizer="Adam",
        opt_args=(("lr", 0.01),),
        schedule="manual-lr",
        sched_args=(("warmup", 3), ("total", 12)),
        location="opt-list",
        clip=True,
        set_to_none=False,
        returns="item",
    ),
]


@pytest.mark.parametrize("spec", ADAM_FAMILY_AT_A_HIGH_LR, ids=["adamw-onecycle", "bert-adam"])
def test_adam_family_under_jit_gives_eagers_numbers_to_the_bit_and_replays(idioms_worker, spec):
    """Recorded capturable, Adam's bias corrections were float32 tensor ops where eager's are
    Python floats: 1.7e-5 to 6.8e-5 off at these learning rates, without a word. Recorded as
    written, the numbers are eager's, and the bias corrections flow into the replays."""
    r = _three_ways(spec)
    assert r.jit.off == 0.0, r.jit
    assert r.jitted.replayed >= spec.calls - WARMUP - 1, r.jitted.reasons


TENSOR_LR_SCHEDULED_INSIDE = [
    LoopSpec(
        seed=2,
        model="embedding",
        norm="BatchNorm1d",
        optimizer="Adagrad",
        lr_tensor=True,
        schedule="CosineAnnealingLR",
        sched_args=(("T_max", 12),),
        sched_inside=True,
        location="opt-dict",
        data="numpy-rows",
        returns="item",
    ),
    LoopSpec(
        seed=3,
        model="lstm",
        optimizer="Adadelta",
        lr_tensor=True,
        schedule="OneCycleLR",
        sched_args=(("max_lr", 10.0), ("total_steps", 12), ("cycle_momentum", False)),
        sched_inside=True,
        location="module",
        clip=True,
    ),
]


@pytest.mark.parametrize(
    "spec", TENSOR_LR_SCHEDULED_INSIDE, ids=["adagrad-cosine", "adadelta-1cycle"]
)
def test_a_tensor_learning_rate_its_scheduler_steps_inside_the_step_replays_as_eager(
    idioms_worker, spec
):
    """``lr=torch.tensor(...)`` and the scheduler stepped inside the step: the scheduler's
    ops on the tensor run outside the block (as each replay steps it), and the step count
    Adagrad reads flows through the numbers computed from it; every call after the warm-up
    replays, and the numbers are eager's."""
    r = _three_ways(spec)
    assert r.jit.off == 0.0, r.jit
    assert r.share >= TARGET_SHARE, r.jitted.reasons
