"""Ops the worker does not know: an error for that op at the next sync, never a dead worker."""

import pytest
import torch
from conftest import assert_close

import gt_core
from gt_core.stream.instructions import DEFOP, OP, PUT, DefOp, Op, Put, Ref
from gt_core.worker_process.executor import Executor


# Defined in the client's process only: a spawned worker has never heard of it.
@torch.library.custom_op("gt_client_only::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("gt_client_only::row_sum", mutates_args=())
def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1)  # no fake kernel: recorded as a sync op, run on the worker at once


def _later(x):
    return (x * 3 + 1).sin().sum(0)


def test_unknown_op_fails_at_the_sync_naming_it(process):
    pid = process.pid
    data = torch.randn(4, 5)
    with gt_core.capture():
        x = gt_core.to_worker(data.clone())
        y = torch.ops.gt_client_only.twice(x)
        z = _later(x)  # recorded after the failing op: computed all the same
        with pytest.raises(gt_core.UnsupportedOperation, match=r"gt_client_only::twice\.default"):
            y.cpu()
        with pytest.raises(RuntimeError, match="never computed"):
            y.cpu()  # its output stays poisoned; the error itself was raised once
        assert_close(z, _later(data))
        assert_close(_later(x * 2), _later(data * 2))
    assert process.alive and process.pid == pid


def test_unknown_op_error_says_how_to_make_it_known(process):
    with gt_core.capture():
        x = gt_core.to_worker(torch.ones(3))
        y = torch.ops.gt_client_only.twice(x)
        with pytest.raises(gt_core.GTError) as info:
            y.sum().item()
    msg = str(info.value)
    assert "worker_imports" in msg and "GT_WORKER_IMPORTS" in msg and "restart" in msg
    assert f"module '{__name__}'" in msg  # where the op was defined in this process


def test_unknown_sync_op_fails_at_once(process):
    pid = process.pid
    data = torch.randn(3, 4)
    with gt_core.capture():
        x = gt_core.to_worker(data.clone())
        with pytest.raises(gt_core.UnsupportedOperation, match=r"gt_client_only::row_sum\.default"):
            torch.ops.gt_client_only.row_sum(x)
        assert_close(x.exp().sum(), data.exp().sum())
    assert process.pid == pid


def test_unknown_op_in_a_repeating_loop(process):
    """A loop that would become hot: the op fails each time, the rest equals eager."""
    gt_core.configure(auto_compile=True, backend="eager")
    gt_core.reset()

    def body(w, op):
        a = w * 1.5 + 1
        c = op(a)
        h = (a.sin() * 2 - 1).cos() + a
        return torch.relu(h / 3) + 0.1, c

    data = torch.randn(8)
    ref = data.clone()
    for _ in range(30):
        ref, _c = body(ref, lambda t: t * 2)
    with gt_core.capture():
        w = gt_core.to_worker(data.clone())
        for _ in range(30):
            w, c = body(w, torch.ops.gt_client_only.twice)
        with pytest.raises(gt_core.UnsupportedOperation, match="gt_client_only::twice"):
            c.cpu()
        assert_close(w, ref)


def test_executor_keeps_serving_after_an_unresolved_defop():
    ex = Executor(torch.device("cpu"))
    a = torch.arange(4.0)
    for ins in [
        Put(PUT, 1, a),
        DefOp(DEFOP, 0, "no_such_lib::op.default"),
        DefOp(DEFOP, 1, "aten::mul.Tensor"),
        Op(OP, 0, (Ref(1),), {}, (2,)),
        Op(OP, 1, (Ref(1), Ref(1)), {}, (3,)),
        Op(OP, 1, (Ref(2), Ref(1)), {}, (4,)),  # uses the failed op's output
    ]:
        ex.execute(ins)
    err = ex.take_error()
    assert isinstance(err, gt_core.UnsupportedOperation) and "no_such_lib::op.default" in str(err)
    assert ex.take_error() is None  # one error for the failure, not one per later use
    torch.testing.assert_close(ex.fetch(3), a * a)
    assert ex.poisoned == {2, 4}


def test_executor_fails_an_op_whose_outputs_do_not_fit_and_keeps_serving():
    ex = Executor(torch.device("cpu"))
    a = torch.arange(4.0)
    for ins in [
        Put(PUT, 1, a),
        DefOp(DEFOP, 0, "aten::add.Tensor"),
        Op(OP, 0, (Ref(1), Ref(1)), {}, (2, 3)),  # one tensor comes, two were inferred
        Op(OP, 0, (Ref(1), Ref(1)), {}, (4,)),
        Op(OP, 0, (Ref(3), Ref(1)), {}, (5,)),  # uses an output never made
    ]:
        ex.execute(ins)
    err = ex.take_error()
    assert isinstance(err, gt_core.OutputMismatch), err
    assert "aten.add.Tensor returned 1 tensors, where the client inferred 2" in str(err)
    assert err.gt_outs == [2, 3]  # (the client names the line that recorded them)
    assert ex.take_error() is None
    torch.testing.assert_close(ex.fetch(4), a + a)
    assert ex.poisoned == {2, 3, 5}


def test_a_hot_path_that_returns_no_tensor_for_an_output_leaves_it_unmade():
    ex = Executor(torch.device("cpu"))
    ex.bind_outputs([1, 2], [torch.ones(2), None], "b1")
    ex.bind_outputs([3], [torch.ones(2), torch.ones(2)], "b2")
    torch.testing.assert_close(ex.fetch(1), torch.ones(2))
    with pytest.raises(gt_core.OutputMismatch, match="the hot path b1 returned None for it"):
        ex.fetch(2)
    err = ex.take_error()
    assert isinstance(err, gt_core.OutputMismatch) and "the hot path b2 returned 2" in str(err)
    assert ex.poisoned == {3}


def test_an_output_its_kernel_makes_with_grad_mode_on_only_is_made(process):
    """The worker runs under no_grad; a kernel that leaves out what a backward needs unless
    grad mode is on (as nn.LSTM's does on the CPU) runs with it on, as the client inferred."""
    import _custom_ops  # noqa: F401

    gt_core.configure(worker_imports=("_custom_ops",))
    process.restart()
    pid, x = process.pid, torch.randn(3, 4)
    with gt_core.capture():
        for _ in range(2):  # (the second call: the op known to need it)
            a, b = torch.ops.gt_tests.kept(gt_core.to_worker(x.clone()))
            assert_close(a * b, (x * 2) * (x + 1))
    assert process.alive and process.pid == pid


def test_an_output_its_kernel_never_makes_fails_the_op_that_uses_it(process):
    import _custom_ops  # noqa: F401

    gt_core.configure(worker_imports=("_custom_ops",))
    process.restart()
    pid, x = process.pid, torch.randn(3, 4)
    with gt_core.capture():
        a, b = torch.ops.gt_tests.dropped(gt_core.to_worker(x.clone()))
        c = b + 1
        with pytest.raises(gt_core.OutputMismatch) as info:
            c.cpu()
        msg = str(info.value)
        assert "aten.add.Tensor used a value that was never made" in msg
        assert "gt_tests.dropped.default returned None for its output 1" in msg
        assert "c = b + 1" in "\n".join(info.value.__notes__)  # the user's line
        assert_close(a, x * 2)  # the session goes on
        with pytest.raises(gt_core.OutputMismatch, match="never made"):
            b.cpu()
        assert_close(gt_core.to_worker(x.clone()).exp(), x.exp())
    assert process.alive and process.pid == pid


def test_worker_imports_make_project_ops_known(process):
    import _custom_ops  # noqa: F401  (the client records them too: their schemas and fakes)

    gt_core.configure(worker_imports=("_custom_ops",))
    process.restart()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    with gt_core.capture():
        wx, wy = gt_core.to_worker(x.clone()), gt_core.to_worker(y.clone())
        out = torch.ops.gt_tests.scale_add(wx, wy, 0.5)
        m = torch.ops.gt_tests.row_max(out)  # no fake kernel: a sync op
        assert_close(out, torch.ops.gt_tests.scale_add(x, y, 0.5))
        assert_close(m, torch.ops.gt_tests.row_max(torch.ops.gt_tests.scale_add(x, y, 0.5)))
    assert process.pid != 0


def test_worker_imports_that_fail_stop_the_start_naming_the_module(process):
    gt_core.configure(worker_imports=("_custom_ops", "gt_no_such_module"))
    process.stop()
    with pytest.raises(gt_core.ConfigError, match=r"gt_no_such_module.*ModuleNotFoundError"):
        process.restart()
    gt_core.configure(worker_imports=())
    assert process.restart().alive


def test_worker_imports_inprocess(inprocess):
    gt_core.configure(worker_imports=("gt_no_such_module",))
    inprocess.stop()
    with pytest.raises(gt_core.ConfigError, match="gt_no_such_module"):
        inprocess.restart()


def test_worker_imports_option():
    from gt_core.options import from_env

    assert from_env({"GT_WORKER_IMPORTS": "a.b, c,"}).worker_imports == ("a.b", "c")
    assert from_env({}).worker_imports == ()
    assert gt_core.Options().replace(worker_imports=["m"]).worker_imports == ("m",)
    for bad in ("my_ops", ("",), (1,)):
        with pytest.raises(gt_core.ConfigError, match="worker_imports"):
            gt_core.Options().replace(worker_imports=bad)
