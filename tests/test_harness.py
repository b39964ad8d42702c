"""The benchmark harness (benchmarks/harness.py): rounds interleaved, ratios per round, no
baseline timed beside gt, and one real run of every way in processes of their own."""

import os
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "benchmarks"))
import harness  # noqa: E402
from harness import Figures, Run, Unfair, measure, plan  # noqa: E402


def _until(ok, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while not ok():
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def test_each_round_turns_the_order_and_times_the_baselines_at_one_thread_and_all_cores():
    rounds = plan(("eager", "compile", "jit"), 3, cores=2)
    assert [[w for w, _ in r] for r in rounds] == [
        ["eager", "eager", "compile", "compile", "jit"],
        ["compile", "compile", "jit", "eager", "eager"],
        ["jit", "eager", "eager", "compile", "compile"],
    ]
    assert {(w, t) for w, t in rounds[0]} == {
        ("eager", 1), ("eager", 2), ("compile", 1), ("compile", 2), ("jit", 2),
    }  # fmt: skip


def _fake(ms: dict, losses: dict | None = None):
    """A run that takes ``ms[(way, threads)][round]`` ms a step, counting its rounds; its
    last loss ``losses[way]`` (0.5 where not given)."""
    seen: dict = {}

    def run(r: Run) -> Figures:
        k = (r.way, r.threads)
        i = seen[k] = seen.get(k, -1) + 1
        v = ms[k][i]
        return Figures(settled_ms=v, first_s=v / 10, cpu_s=1.0, loss=(losses or {}).get(r.way, 0.5))

    return run


def test_a_way_whose_loss_is_not_eagers_is_said_to_compare_nothing():
    """The same loop from the same seeds: a way that ends with NaN (a torch.compile of a
    step gave NaN on the corpus's BERT) or another loss computed something else, and the
    table says so under its figures; rounding within LOSS_RTOL is eager's."""
    ms = {("eager", 1): [4.0, 4.0], ("compile", 1): [2.0, 2.0], ("jit", 1): [2.0, 2.0]}
    near = 0.5 * (1 + harness.LOSS_RTOL / 2)
    rows = measure("w", ("eager", "compile", "jit"), 2, cores=1, alive=list,
                   run=_fake(ms, {"compile": float("nan"), "jit": near}))  # fmt: skip
    assert list(harness.wrong(rows)) == [("compile", 1)]
    text = harness.table("w", rows)
    assert "! compile 1t: its last loss nan is not eager's 0.5" in text
    assert "! jit" not in text
    rows = measure("w", ("eager", "jit"), 2, run=_fake(ms, {"jit": 0.6}), alive=list, cores=1)
    assert list(harness.wrong(rows)) == [("jit", 1)]


def test_a_ratio_is_taken_per_round_against_that_rounds_best_eager():
    """Round 1 is slow for everyone (the machine was busy): per-round ratios see through it."""
    ms = {
        ("eager", 1): [4.0, 8.0, 4.0],
        ("eager", 2): [5.0, 10.0, 3.0],
        ("jit", 2): [2.0, 4.0, 1.5],
    }
    rows = measure("w", ("eager", "jit"), 3, run=_fake(ms), alive=list, cores=2)
    jit = rows[("jit", 2)].summary()
    assert rows[("jit", 2)].settled_ratio == [2.0, 2.0, 2.0]
    assert jit["settled_x_eager"] == {"median": 2.0, "low": 2.0, "high": 2.0, "rounds": 3}
    assert rows[("eager", 2)].settled_ratio == [0.8, 0.8, 1.0]
    assert jit["settled_ms"] == 2.0


def test_a_way_that_fails_is_its_error_and_the_other_ways_go_on():
    """torch.compile cannot run a step (a DCGAN's backward through a graph break raised):
    that way's row is the error, not run again, and every other way is still timed."""
    ms = {("eager", 1): [2.0, 2.0], ("jit", 1): [1.0, 1.0]}
    ran = []

    def run(r: Run) -> Figures:
        ran.append(r.way)
        if r.way == "compile":
            raise harness.Failed("compile raised: RuntimeError: Trying to backward twice")
        return Figures(ms[(r.way, 1)][0], 0.1, 1.0, 0.5)

    rows = measure("w", ("eager", "compile", "jit"), 2, run=run, alive=list, cores=1)
    assert ran.count("compile") == 1 and ran.count("jit") == 2
    assert rows[("compile", 1)].summary() == {
        "way": "compile", "threads": 1, "failed": "compile raised: RuntimeError: Trying to backward twice"
    }  # fmt: skip
    assert rows[("jit", 1)].settled_ratio == [2.0, 2.0]
    assert "compile 1t      failed: compile raised" in harness.table("w", rows)


def test_no_baseline_is_timed_while_a_process_of_gt_is_alive():
    ms = {("eager", 1): [1.0], ("jit", 1): [1.0]}
    alive = iter([[], [4242]])  # (gt's worker of the jit run, still there at round 2)
    with pytest.raises(Unfair, match="4242"):
        measure("w", ("jit", "eager"), 2, run=_fake({**ms, ("jit", 1): [1.0, 1.0]}),
                alive=lambda: next(alive), cores=1)  # fmt: skip


def test_the_first_steps_and_the_settled_chunks_are_timed_apart():
    """The clock is injected: 5 s pass over the first calls (a compile), then 0.1 s a call."""
    calls = []

    class Loss:
        def item(self):
            return 0.25

    def fn():
        calls.append(1)
        return Loss()

    now = [0.0]

    def clock():
        return now[0]

    def step():
        now[0] += 5.0 / 3 if len(calls) <= 3 else 0.1
        return fn()

    r = Run("w", "eager", 1, steps=20, first=3)
    got = harness._timed(step, r, settle=lambda: None, clock=clock)
    assert got.first_s == pytest.approx(5.0)
    assert got.settled_ms == pytest.approx(100.0)
    assert len(calls) == 3 + harness.SETTLE + 20 and got.loss == 0.25


def test_corpus_stands_for_every_real_loop_and_each_iterates_its_own_data():
    """``corpus`` names every loop of gt_bench/corpus; a loop's iteration draws the
    next batch of its DataLoader (two iterations, two batches) and returns the loss."""
    from gt_bench import corpus

    names = harness.workloads(["mlp", "corpus"])
    assert names == ["mlp", *(f"corpus:{n}" for n in corpus.names())]
    seen = []
    step, iterate = harness.workload_step("corpus:encoder-clip-value")

    def spy(batch):
        seen.append(batch[0].clone())
        return step(batch)

    losses = [iterate(spy).item() for _ in range(2)]
    assert len(seen) == 2 and not torch.equal(seen[0], seen[1])
    assert all(x == x and x > 0 for x in losses)
    with pytest.raises(ValueError, match="corpus:NAME"):
        harness.workload_step("nope")


def _ours() -> list[int]:
    """The processes of gt this test process started, or a harness run did: those a run of
    the suite on several workers (pytest-xdist) starts beside it are another test's."""
    import psutil

    kids = {p.pid for p in psutil.Process().children(recursive=True)}
    runs = []
    for p in psutil.process_iter(["pid"]):
        try:
            if harness.TOKEN in p.environ():
                runs.append(p.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return sorted({pid for pid in harness.gt_processes() if pid in kids} | set(runs))


def test_a_real_run_of_eager_and_jit_each_in_a_process_of_its_own_leaves_no_gt_alive():
    """Two rounds of the MLP, eager (1 thread and all) and jit (backend eager): each way a
    process of its own; the loop is the same, so the last losses agree; nothing of gt is left.
    (This test process's own worker, of the tests before, is stopped first: the harness
    would refuse to time eager beside it. Its figures are not asserted, so the processes of
    other tests running beside it do not count: ``alive`` names this test's.)"""
    import gt_core

    gt_core.worker().stop()
    assert _until(lambda: not _ours(), 30), _ours()
    rows = measure("mlp", ("eager", "jit"), 2, steps=30, first=5, backend="eager", alive=_ours)
    ways = {way for way, _ in rows}
    assert ways == {"eager", "jit"}
    losses = [r.runs[-1].loss for r in rows.values()]
    assert max(losses) - min(losses) < 1e-4, losses
    for row in rows.values():
        assert len(row.runs) == 2 and all(f.settled_ms > 0 and f.cpu_s > 0 for f in row.runs)
    assert _ours() == []
    text = harness.table("mlp", rows)
    assert "jit" in text and "x eager" in text
    # jit's block, judged in each round: its state and the runs it took to settle (65 runs:
    # past the judge's patience with the compile process warming up beside them).
    (jit,) = [row for (way, _), row in rows.items() if way == "jit"]
    assert all(f.block in ("compiled", "reverted") and f.settle_runs for f in jit.runs), jit.runs
    assert "its largest block" in text and "settled after" in text


def test_gt_ways_say_their_blocks_verdict_in_every_round_and_what_settling_took():
    """A verdict that differs between rounds (kept in two, reverted in one) shows as such."""
    runs = [Figures(2.0, 0.2, 1.0, 0.5, block, n)
            for block, n in (("compiled", 10), ("reverted", 12), ("compiled", 11))]  # fmt: skip
    assert harness._verdicts(runs) == (
        "its largest block compiled in 2 of 3 rounds, reverted in 1 of 3 rounds, "
        "settled after 11 runs (10-12)"
    )
    assert harness._verdicts([Figures(2.0, 0.2, 1.0, 0.5, "compiling", None)]) == (
        "its largest block compiling in 1 of 1 rounds"
    )
    data = {"hot_paths": [
        {"n_ops": 3, "status": "compiled", "settled": {"runs": 4}},
        {"n_ops": 9, "status": "reverted", "settled": {"runs": 7, "t": 1.0}},
    ]}  # fmt: skip
    assert harness.largest_block(data) == {"block": "reverted", "settle_runs": 7}
    assert harness.largest_block({"hot_paths": []}) == {"block": None, "settle_runs": None}
