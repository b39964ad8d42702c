"""Storage reuse for staged tensors: memory goes to a new tensor only once nothing holds it."""

import pytest
import torch

from gt_core.stream import staging
from gt_core.stream.storage_pool import MIN_BYTES, Pool

MB = 1 << 20


def _empty(pool, shape=(MB // 4,), dtype=torch.float32):
    stride = torch.empty(shape, device="meta").stride()
    return pool.empty(shape, stride, dtype, int(torch.Size(shape).numel()) * dtype.itemsize)


def test_a_freed_storage_takes_the_next_tensor_of_its_size():
    pool = Pool(64 * MB)
    a = _empty(pool)
    ptr = a.data_ptr()
    del a
    b = _empty(pool)
    assert b.data_ptr() == ptr
    assert pool.held == MB


def test_a_storage_still_held_anywhere_is_never_handed_out():
    pool = Pool(64 * MB)
    a = _empty(pool)
    view = a[10:20]
    storage = a.untyped_storage()
    ptr = a.data_ptr()
    del a
    b = _empty(pool)  # the view still holds the first storage
    assert b.data_ptr() != ptr
    del view
    c = _empty(pool)  # a storage object still holds it
    assert c.data_ptr() not in (ptr, b.data_ptr())
    b.fill_(1)
    c.fill_(2)
    assert storage.nbytes() == MB


def test_a_reused_tensor_looks_like_a_fresh_one():
    pool = Pool(64 * MB)
    shape = (512, 1024)
    t = torch.empty(shape).t()  # a transposed layout, as a staged tensor keeps it
    del t
    for _ in range(2):
        got = pool.empty((1024, 512), (1, 1024), torch.float32, MB * 2)
        fresh = torch.empty_strided((1024, 512), (1, 1024))
        assert got.shape == fresh.shape and got.stride() == fresh.stride()
        assert got.storage_offset() == 0
        assert got.untyped_storage().nbytes() == fresh.untyped_storage().nbytes()
        assert got.dtype == torch.float32
        del got


def test_small_tensors_are_left_to_the_allocator():
    pool = Pool(64 * MB)
    _empty(pool, shape=(MIN_BYTES // 8,))
    assert pool.held == 0


def test_the_pool_stays_under_its_limit_letting_go_of_the_oldest_free_sizes():
    pool = Pool(3 * MB)
    a, b = _empty(pool, (MB // 4,)), _empty(pool, (MB // 2,))  # 1 MB and 2 MB: full
    assert pool.held == 3 * MB
    c = _empty(pool, (MB // 4 * 3,))  # 3 MB: neither is free, so not pooled
    assert pool.held == 3 * MB and c.numel() == MB // 4 * 3
    del a, b
    d = _empty(pool, (MB // 4 * 3,))  # both freed: the oldest go first
    assert pool.held == 3 * MB and list(pool.sizes) == [3 * MB]
    del c, d


def test_staged_uploads_of_one_size_reuse_their_storage_and_keep_their_values():
    writer = staging.Writer(16 * MB, make_room=lambda: None)
    reader = staging.Reader(reuse=64 * MB)
    try:
        got, ptrs = [], set()
        for i in range(6):
            out = reader.take(writer.stage(torch.full((2 * MB // 4,), float(i))))
            ptrs.add(out.data_ptr())
            got.append(out.sum().item())
            if i % 2:
                kept = out  # one stays alive across the next upload
            del out
        assert got == [float(i) * 2 * MB // 4 for i in range(6)]
        assert len(ptrs) <= 3  # not a fresh mapping per upload
        assert kept.eq(5.0).all()
    finally:
        writer.close()
        reader.close()


@pytest.mark.parametrize("dtype", [torch.bool, torch.bfloat16, torch.complex64, torch.int64])
def test_staged_tensors_of_every_dtype_come_out_of_reused_storage_equal(dtype):
    writer = staging.Writer(16 * MB, make_room=lambda: None)
    reader = staging.Reader(reuse=64 * MB)
    try:
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            host = (torch.randn(1024, 1024, generator=g) * 100).to(dtype).t()
            out = reader.take(writer.stage(host))
            assert out.dtype == dtype and out.stride() == host.stride()
            torch.testing.assert_close(out, host, atol=0, rtol=0)
            del out
        assert reader.pool.held > 0
    finally:
        writer.close()
        reader.close()
