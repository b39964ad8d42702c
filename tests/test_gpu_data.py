"""The data path on a GPU worker: uploads through pinned memory, copied to the device
asynchronously in stream order; fetches back. Eager on the same GPU is the oracle."""

import contextlib

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close
from torch.utils.data import DataLoader, TensorDataset

import gt_core

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture
def cuda_worker(_process_worker):
    gt_core.worker().stop()
    gt_core.configure(
        worker="process", device="cuda", backend="eager", auto_compile=False,
        regression_samples=10_000,
    )  # fmt: skip
    gt_core.reset()
    yield gt_core.worker()
    gt_core.worker().stop()


HOST = {
    "64 MB float32": lambda: torch.randn(16 << 20),
    "4 MB transposed": lambda: torch.randn(1024, 1024).t(),
    "200 KB bfloat16": lambda: torch.randn(100 << 10).to(torch.bfloat16),
    "bool": lambda: torch.rand(3000) > 0.5,
    "int64 scalar": lambda: torch.tensor(7),
}


@pytest.mark.parametrize("make", HOST.values(), ids=HOST.keys())
def test_uploads_reach_the_gpu_and_come_back_equal(cuda_worker, make):
    host = make()
    with gt_core.capture():
        got = host * 2  # uploaded on the way, computed on the GPU
        back = got.cpu()
    assert torch.device(cuda_worker.device).type == "cuda"
    assert_close(back, host * 2, atol=0, rtol=0)


def test_many_uploads_in_flight_each_keep_their_values(cuda_worker):
    """A pinned block is reused only after its copy to the device has run: 200 uploads of the
    same size, none synced until the end, each a different value."""
    hosts = [torch.full((256, 1024), float(i)) for i in range(200)]
    with gt_core.capture():
        total = torch.zeros(256, 1024)
        for h in hosts:
            total += h
            h.add_(1000)  # the host tensor changes right after its upload: the copy holds
        got = total.cpu()
    assert_close(got, torch.full((256, 1024), float(sum(range(200)))), atol=0, rtol=0)


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def _start() -> dict:
    """One start for both sides, drawn without touching the global generator."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return _mlp().state_dict()


def _train(on_worker: bool, steps: int = 30):
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64 * 10, 784, generator=g), torch.randint(0, 10, (64 * 10,), generator=g)
    loader = DataLoader(
        TensorDataset(x, y), batch_size=64, shuffle=True,
        generator=torch.Generator().manual_seed(1), pin_memory=not on_worker,
    )  # fmt: skip
    with contextlib.nullcontext() if on_worker else torch.device("cuda"):
        model = _mlp()
    model.load_state_dict(_start())  # the same start on both (host tensors: uploaded)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    done = 0
    while done < steps:
        for xb, yb in loader:
            if not on_worker:
                xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
            F.cross_entropy(model(xb), yb).backward()
            opt.step()
            opt.zero_grad()
            done += 1
    return [p.detach().cpu() for p in model.parameters()]


def test_a_dataloader_loop_on_a_gpu_worker_equals_eager_on_the_gpu(cuda_worker):
    want = _train(on_worker=False)
    with gt_core.capture():
        got = _train(on_worker=True)
    for a, b in zip(got, want, strict=True):
        assert_close(a, b, atol=1e-5, rtol=1e-5)
