"""Plans with the same ops and other input shapes (one step at two batch sizes): each
occurrence goes out as the RUN of the plan its inputs fit, no plan is withdrawn, and each
block's sites (lines, modules, phases) are taken. Eager is the oracle."""

import contextlib

import pytest
import torch
from conftest import assert_close

import gt_core
from gt_core.client.plans.plan_match import PlanMatcher
from gt_core.stream.canonical import OpEntry
from gt_core.stream.instructions import OP, RUN, Op, Ref
from gt_core.stream.meta import TensorMeta
from gt_core.stream.plan import Plan, Slot

COMPILES: list = []


@torch._dynamo.register_backend
def gt_counting_shapes(gm, example_inputs):
    COMPILES.append([tuple(t.shape) for t in example_inputs])
    return gm.forward


# -- the matcher on its own ------------------------------------------------------------------
def _plan(sig: str, batch: int) -> Plan:
    # mm(in0, in1) -> t0, in0 a (batch, 4) float batch, in1 a (4, 4) weight
    entries = (OpEntry("op", 0, (Slot("i", 0), Slot("i", 1)), {}, (0,)),)
    metas = (((batch, 4), (4, 1), torch.float32), ((4, 4), (4, 1), torch.float32))
    return Plan(sig, entries, 2, 0, metas)


class _P:
    """What the matcher reads of a proxy argument: its id and metadata."""

    def __init__(self, vid: int, batch: int):
        self.gt_value_id = vid
        self.gt_meta = TensorMeta((batch, 4), (4, 1), torch.float32, 0)


@pytest.mark.parametrize("batch, sig", [(128, "b128"), (64, "b64")])
def test_an_occurrence_completes_as_the_plan_its_inputs_fit(batch, sig):
    out = []
    m = PlanMatcher(out.append, lambda: None)
    m.offer("b128", _plan("b128", 128))
    m.offer("b64", _plan("b64", 64))
    x, w = _P(1, batch), _P(2, 4)
    w.gt_meta = TensorMeta((4, 4), (4, 1), torch.float32, 0)
    m.feed(Op(OP, 0, (Ref(1), Ref(2)), {}, (10,)), (x, w))
    assert out == [(RUN, sig, [1, 2], [10], [])]


def test_an_occurrence_no_plan_fits_goes_out_as_its_instructions():
    out = []
    m = PlanMatcher(out.append, lambda: None)
    m.offer("b128", _plan("b128", 128))
    x, w = _P(1, 32), _P(2, 4)
    w.gt_meta = TensorMeta((4, 4), (4, 1), torch.float32, 0)
    op = Op(OP, 0, (Ref(1), Ref(2)), {}, (10,))
    m.feed(op, (x, w))
    assert out == [op] and m.runs == 0


# -- through the worker ----------------------------------------------------------------------
@pytest.fixture
def hot(inprocess):
    COMPILES.clear()
    gt_core.configure(
        auto_compile=True, background=False, threshold=3, backend="gt_counting_shapes"
    )


def _train(order: list[int], on_worker: bool):
    """An MLP trained with SGD at the batch sizes of ``order``, one step each."""
    ctx = gt_core.capture() if on_worker else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(32, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
        )
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        data = {b: (torch.randn(b, 32), torch.randn(b, 4)) for b in sorted(set(order))}
        for b in order:
            x, y = data[b]
            loss = torch.nn.functional.mse_loss(model(x), y)  # FORWARD
            loss.backward()
            opt.step()
            opt.zero_grad()
        final = loss.item()
        params = [p.detach().cpu().clone() for p in model.parameters()]
    return params, final


ORDERS = {
    "switching": ([128] * 12 + [64] * 12) * 3,  # a step at one size, then at another
    "alternating-runs": ([128] * 4 + [64] * 4) * 8,
}


@pytest.mark.parametrize("order", list(ORDERS.values()), ids=list(ORDERS))
def test_same_ops_at_two_batch_sizes_run_both_blocks_compiled_and_sited(hot, order):
    params, final = _train(order, on_worker=True)
    gt_core.wait()
    want, want_final = _train(order, on_worker=False)
    for a, b in zip(params, want, strict=True):
        assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert final == pytest.approx(want_final, rel=1e-6, abs=1e-6)
    engine = gt_core.client.capture.session().transport.engine
    blocks = list(engine.blocks.values())
    assert len(blocks) == 2 and not any(b.withdrawn for b in blocks)
    paths = gt_core.report().to_data()["hot_paths"]
    assert sorted(p["status"] for p in paths) == ["compiled", "compiled"]
    sizes = [{i["shape"][0] for i in p["canonical"]["inputs"] if i["shape"]} for p in paths]
    assert sorted(len(s & {64, 128}) for s in sizes) == [1, 1] and sizes[0] != sizes[1]
    assert len(COMPILES) == 2
    for p in paths:
        assert p["compiled_runs"] >= 4
        ops = [e for e in p["canonical"]["entries"] if e["kind"] == "op"]
        assert all(e["source"] and e["phase"] for e in ops), p["signature"]
        assert {"0", "1", "2"} <= {e["module"] for e in ops}
        assert p["lines"]
