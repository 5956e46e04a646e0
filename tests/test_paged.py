"""Paged KV cache (issue 8): ``kv_compact_paged`` (native CPU, reference, CUDA kernel under the
emulator) and ``decode_step``/``generate`` on a paged cache, token for token equal to the
contiguous cache."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import redrafter_ext as rx
from redrafter_ext import reference as ref

sys.path.insert(0, str(Path(__file__).parent / "emu"))
import emu_build  # noqa: E402

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
SEEDS = (1, 2, 3)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def paged_inputs(B, L, block_size, dtype, seed, idx=torch.int64, n_layers=2, H=2, D=8, S=40, spare=3, garbage=True):
    """Random pages, a shuffled block table (``spare`` unused blocks), accept_len in [-1, L-1] and
    paths with path[i] >= i that fit the row. Inactive rows get a garbage block table (ids out of
    range, or another row's blocks): it must never be looked at."""
    g = gen(seed)
    max_blocks = -(-S // block_size)
    S = max_blocks * block_size
    num_blocks = B * max_blocks + spare
    pages = torch.randn(n_layers, num_blocks, 2, H, block_size, D, generator=g).to(dtype)
    table = torch.randperm(num_blocks, generator=g)[: B * max_blocks].view(B, max_blocks).to(torch.int32)
    acc = torch.randint(-1, L, (B,), generator=g)
    acc[0] = L - 1  # at least one active row with a full path
    path = torch.full((B, L), -1, dtype=torch.int64)
    cache_len = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        a = int(acc[b])
        for i in range(a + 1):
            path[b, i] = i + int(torch.randint(0, min(S - L, 3 * L) + 1, (), generator=g))
        top = int(path[b, : a + 1].max()) if a >= 0 else -1
        hi = S - 1 - top if a >= 0 else S
        cache_len[b] = int(torch.randint(0, hi + 1, (), generator=g))
        if b == 0:
            cache_len[b] = hi  # the last slot of the row is written
        if a < 0 and garbage:
            table[b] = -5 if b % 2 else table[0]
    return pages, table, cache_len, path.to(idx), acc.to(idx)


def to_contiguous(pages: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """(n_layers, 2, B, H, S, D) copy of the rows' logical slots (block ids clamped: garbage rows)."""
    t = table.long().clamp(0, pages.shape[1] - 1)
    g = pages[:, t]  # [n_layers, B, max_blocks, 2, H, bs, D]
    n, B, mb, two, H, bs, D = g.shape
    return g.permute(0, 3, 1, 4, 2, 5, 6).reshape(n, two, B, H, mb * bs, D).contiguous()


def run_both(inputs):
    pages, table, cache_len, path, acc = inputs
    p1, c1 = pages.clone(), cache_len.clone()
    rx.ops.kv_compact_paged(p1, table, c1, path, acc)
    p2, c2 = pages.clone(), cache_len.clone()
    ref.kv_compact_paged(p2, table, c2, path, acc)
    return (p1, c1), (p2, c2)


# ---- native CPU == reference == contiguous kv_compact --------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B", (1, 3, 7))
@pytest.mark.parametrize("block_size", (1, 5, 16))
def test_native_matches_reference(dtype, B, block_size):
    for k, L in enumerate((1, 4, 9)):
        idx = (torch.int32, torch.int64)[k % 2]
        inputs = paged_inputs(B, L, block_size, dtype, seed=100 * B + 10 * block_size + k, idx=idx, D=(1, 8, 3)[k])
        pages, table, cache_len, path, acc = inputs
        (p1, c1), (p2, c2) = run_both(inputs)
        assert torch.equal(c1, c2)
        assert torch.equal(p1.view(torch.uint8) if dtype != torch.float32 else p1, p2.view(torch.uint8)
                           if dtype != torch.float32 else p2)
        # the same step on the contiguous layout, for the active rows
        kv = to_contiguous(pages, table)
        c3 = cache_len.clone()
        ref.kv_compact(kv, c3, path, acc)
        assert torch.equal(c1, c3)
        after = to_contiguous(p1, table)
        active = acc >= 0
        assert torch.equal(after[:, :, active], kv[:, :, active])
        # inactive rows' blocks (and the spare ones) are untouched: only active rows' blocks change
        owned = table[active].long().flatten()
        others = torch.ones(pages.shape[1], dtype=torch.bool)
        others[owned] = False
        assert torch.equal(p1[:, others], pages[:, others])


def test_paths_cross_block_boundaries():
    # block size 5, cache_len 3: destinations 3..9 span blocks 0-1, sources up to 22 span 4 blocks
    pages, table, cache_len, path, acc = paged_inputs(2, 7, 5, torch.float32, seed=7, S=30, garbage=False)
    cache_len[:] = torch.tensor([3, 8], dtype=torch.int32)
    acc[:] = torch.tensor([6, 3])
    path[0] = torch.tensor([0, 4, 7, 9, 12, 15, 19])
    path[1] = torch.tensor([0, 1, 5, 11, -1, -1, -1])
    (p1, c1), (p2, c2) = run_both((pages, table, cache_len, path, acc))
    assert torch.equal(p1, p2) and torch.equal(c1, c2) and c1.tolist() == [10, 12]
    kv = to_contiguous(pages, table)
    want = kv[:, :, 0, :, [3 + int(p) for p in path[0]]]
    assert torch.equal(to_contiguous(p1, table)[:, :, 0, :, 3:10], want)


def test_all_rows_inactive_is_a_no_op():
    pages, table, cache_len, path, acc = paged_inputs(3, 4, 5, torch.bfloat16, seed=3)
    acc[:] = -1
    (p1, c1), (p2, c2) = run_both((pages, table, cache_len, path, acc))
    for p, c in ((p1, c1), (p2, c2)):
        assert torch.equal(p.view(torch.int16), pages.view(torch.int16)) and torch.equal(c, cache_len)


def test_opcheck():
    for dtype, bs in ((torch.float32, 5), (torch.bfloat16, 16)):
        pages, table, cache_len, path, acc = paged_inputs(3, 4, bs, dtype, seed=11)
        torch.library.opcheck(torch.ops.redrafter.kv_compact_paged.default, (pages, table, cache_len, path, acc))


def _bad_cases():
    """(name, mutate(inputs) -> inputs, exception, message regex)."""

    def edit(fn):
        def f(x):
            x = [t.clone() for t in x]
            fn(x)
            return x

        return f

    def set_(i, index, value):
        return edit(lambda x: x[i].__setitem__(index, value))

    return [
        ("accept_len", set_(4, 1, 9), ValueError, r"accept_len\[1\] = 9"),
        ("cache_len", set_(2, 1, -1), ValueError, r"cache_len\[1\] = -1"),
        ("path_nodes<i", edit(lambda x: (x[4].__setitem__(1, 2), x[3].__setitem__((1, 1), 0))), ValueError,
         r"path_nodes\[1, 1\] = 0"),
        ("path_nodes>S", edit(lambda x: (x[4].__setitem__(1, 1), x[3].__setitem__((1, 1), 10**6))), ValueError,
         r"cache_len\[1\] \+ path_nodes\[1, 1\]"),
        ("block id", edit(lambda x: (x[4].__setitem__(1, 0), x[3].__setitem__((1, 0), 0),
                                     x[1].__setitem__((1, slice(None)), 10**6))), ValueError, r"block_table\[1, \d+\] = 1000000"),
        # row 1 writes slot 12 (its logical block 2), row 0 reads slot 9 (its logical block 1)
        ("shared block", edit(lambda x: x[1].__setitem__((1, 2), x[1][0, 1])), ValueError,
         r"block_table\[0, 1\] and block_table\[1, 2\] are both block"),
        ("aliased in row", edit(lambda x: x[1].__setitem__((1, 3), x[1][1, 2])), ValueError,
         r"block_table\[1, 2\] and block_table\[1, 3\] are both block"),
        ("table dtype", edit(lambda x: x.__setitem__(1, x[1].long())), TypeError, "block_table must have dtype int32"),
        ("table rank", edit(lambda x: x.__setitem__(1, x[1][0])), ValueError, "block_table must have 2 dims"),
        ("pages rank", edit(lambda x: x.__setitem__(0, x[0][0])), ValueError, "kv_pages must have 6 dims"),
        ("pages dim 2", edit(lambda x: x.__setitem__(0, torch.cat([x[0]] * 2, 2))), ValueError, "kv_pages dim 2 must be 2"),
        ("pages strided", edit(lambda x: x.__setitem__(0, x[0].transpose(3, 5))), ValueError, "kv_pages must be contiguous"),
        ("cache_len shape", edit(lambda x: x.__setitem__(2, x[2][:2])), ValueError, r"cache_len must have shape \(B,\)"),
        ("path_nodes rows", edit(lambda x: x.__setitem__(3, x[3][:2])), ValueError, "path_nodes must have shape"),
        ("path_nodes dtype", edit(lambda x: x.__setitem__(3, x[3].float())), TypeError, "path_nodes must have dtype"),
        ("device", edit(lambda x: x.__setitem__(4, x[4].to("meta"))), ValueError, "accept_len is on meta"),
    ]


def good_inputs():
    """Rows 0-1 active (paths crossing blocks of 5), row 2 inactive with a garbage block table."""
    pages, table, _, _, _ = paged_inputs(3, 4, 5, torch.float32, seed=5, garbage=False)
    table[2] = -5
    cache_len = torch.tensor([3, 12, 7], dtype=torch.int32)
    path = torch.tensor([[0, 1, 4, 6], [0, 2, 5, -1], [-1, -1, -1, -1]])
    return [pages, table, cache_len, path, torch.tensor([3, 2, -1])]


def test_good_inputs_pass():
    (p1, c1), (p2, c2) = run_both(good_inputs())
    assert torch.equal(p1, p2) and c1.tolist() == c2.tolist() == [7, 15, 7]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_native_rejects_bad_input_before_writing(case):
    _, mutate, exc, msg = case
    bad = mutate(good_inputs())
    pages0, len0 = bad[0].clone(), bad[2].clone()
    with pytest.raises(exc, match=msg):
        rx.ops.kv_compact_paged(*bad)
    if bad[0].device.type == "cpu":
        assert torch.equal(bad[0], pages0) and torch.equal(bad[2], len0)  # nothing written


def test_reference_rejects_bad_values():
    for _name, mutate, _, _ in _bad_cases()[:7]:
        bad = mutate(good_inputs())
        with pytest.raises(RuntimeError, match="kv_compact_paged"):
            ref.kv_compact_paged(*bad)


# ---- the CUDA kernel under the host emulator -------------------------------------------------
@pytest.fixture(scope="module")
def emu():
    return emu_build.build()


def np_of(t: torch.Tensor) -> np.ndarray:
    """numpy copy of a CPU tensor; 16-bit floats as their uint16 bits."""
    t = t.contiguous().clone()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def check_emu(emu, pages, table, cache_len, path, acc):
    p2, c2 = pages.clone(), cache_len.clone()
    ref.kv_compact_paged(p2, table, c2, path, acc)
    for seed in SEEDS:
        p1, c1 = np_of(pages), np_of(cache_len)
        emu.set_seed(seed)
        emu.kv_compact_paged(p1, np_of(table), c1, np_of(path), np_of(acc))
        assert np.array_equal(c1, c2.numpy()), f"seed {seed}"
        assert np.array_equal(p1, np_of(p2)), f"seed {seed}"


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B", (1, 3, 7))
def test_cuda_kernel_emulated(emu, dtype, B):
    for k, (bs, L, D) in enumerate(((1, 5, 8), (5, 9, 3), (16, 4, 64), (5, 20, 1))):  # 16-byte .. 1-2 byte vectors
        idx = (torch.int32, torch.int64)[k % 2]
        check_emu(emu, *paged_inputs(B, L, bs, dtype, seed=10 * B + k, idx=idx, D=D, S=48))


def test_cuda_kernel_emulated_guards(emu):
    # rows with out-of-range values are left untouched (cache_len included); the CPU op raises
    pages, table, cache_len, path, acc = good_inputs()
    cache_len[2] = 20
    acc[2] = 0
    path[2, 0] = 0
    table[2] = torch.arange(40, 48, dtype=torch.int32)  # ids >= num_blocks: row 2 untouched
    p1, c1 = np_of(pages), np_of(cache_len)
    emu.kv_compact_paged(p1, np_of(table), c1, np_of(path), np_of(acc))
    good = good_inputs()
    good[4][2] = -1
    p2, c2 = good[0].clone(), good[2].clone()
    ref.kv_compact_paged(p2, good[1], c2, good[3], good[4])
    assert c1.tolist() == [7, 15, 20] and np.array_equal(p1, p2.numpy())
