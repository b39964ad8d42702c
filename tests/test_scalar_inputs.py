"""A compiled block's lifted scalars: made once per block on the CPU, rewritten per run."""

import torch

from gt_core.hotpath.scalar_inputs import ScalarInputs

DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def test_each_run_gets_the_numbers_torch_tensor_would_make():
    share = ScalarInputs(torch.device("cpu"))
    for values in ([0.1, 1 / 3, 1e-8, -2.5], [3e38, 1e-300, 7.0, 0.2]):
        got = share.of("b", values, DTYPES)
        want = [torch.tensor(v, dtype=dt) for v, dt in zip(values, DTYPES, strict=True)]
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and g.shape == () and torch.equal(g, w), (g, w)


def test_the_cpu_reuses_a_blocks_tensors_and_blocks_do_not_share_them():
    share = ScalarInputs(torch.device("cpu"))
    first = share.of("a", [1.0], (torch.float32,))
    again = share.of("a", [2.0], (torch.float32,))
    other = share.of("b", [3.0], (torch.float32,))
    assert again[0] is first[0] and first[0].item() == 2.0
    assert other[0] is not first[0] and first[0].item() == 2.0
    assert share.of("c", [], ()) == []


def test_a_block_whose_output_shares_a_scalars_memory_gets_fresh_ones():
    share = ScalarInputs(torch.device("cpu"))
    (s,) = share.of("a", [1.5], (torch.float32,))
    share.ran("a", (torch.ones(2), [s.view(())]))  # (an output a view of the scalar)
    (fresh,) = share.of("a", [2.5], (torch.float32,))
    assert fresh is not s and s.item() == 1.5 and fresh.item() == 2.5
    (clean,) = share.of("b", [1.0], (torch.float32,))
    share.ran("b", (clean * 2,))
    assert share.of("b", [4.0], (torch.float32,))[0] is clean


def test_another_device_gets_fresh_tensors_each_run():
    share = ScalarInputs(torch.device("meta"))
    a = share.of("a", [1.0], (torch.float32,))
    b = share.of("a", [2.0], (torch.float32,))
    assert a[0] is not b[0] and a[0].device.type == "meta"


def test_a_sharded_run_gets_fresh_tensors_each_run():
    share = ScalarInputs(torch.device("cpu"))
    a = share.of("a", [1.0], (torch.float32,), fresh=True)
    b = share.of("a", [2.0], (torch.float32,), fresh=True)
    assert a[0] is not b[0] and a[0].item() == 1.0 and b[0].item() == 2.0
