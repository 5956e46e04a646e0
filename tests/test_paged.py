"""Paged KV cache: ``kv_compact_paged`` (native CPU, reference, CUDA kernel under the
emulator) and ``decode_step``/``generate`` on a paged cache, token for token equal to the
contiguous cache."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from cases import gen
from emu import emu_build
from helpers import OracleDrafter, random_drafter, random_target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_decode import steps_without_host_sync  # the no-host-sync check of decode_step's tests

import redrafter_ext as rx
from redrafter_ext import reference as ref
from redrafter_ext.decode import _start
from redrafter_ext.models import PagedKV

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
SEEDS = (1, 2, 3)


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
        assert torch.equal(p1.view(torch.uint8), p2.view(torch.uint8))  # bits (NaN-safe)
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 5), st.integers(1, 8), st.integers(1, 7), st.integers(0, 2**31 - 1), st.sampled_from(FLOATS))
def test_native_matches_reference_hypothesis(B, L, block_size, seed, dtype):
    inputs = paged_inputs(B, L, block_size, dtype, seed, D=3, S=L + seed % 13, spare=seed % 3)
    (p1, c1), (p2, c2) = run_both(inputs)
    assert torch.equal(c1, c2) and torch.equal(p1.view(torch.uint8), p2.view(torch.uint8))


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
    op = torch.ops.redrafter.kv_compact_paged.default
    torch.library.opcheck(op, paged_inputs(3, 4, 5, torch.bfloat16, seed=11))
    # a second sample without the (slow) AOT-dispatch test
    torch.library.opcheck(op, paged_inputs(2, 3, 16, torch.float32, seed=12, idx=torch.int32),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))


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
    # REDRAFTER_EMU_SANITIZE=1 (with libasan preloaded, as test_cuda_emulated.test_sanitized does)
    # runs these tests on the ASan+UBSan build
    return emu_build.build(sanitize=os.environ.get("REDRAFTER_EMU_SANITIZE") == "1")


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


# ---- decode_step / generate on a paged cache == the contiguous cache ------------------------------
PROMPTS_3 = [[5, 17, 3, 9, 22, 41, 8], [60, 2], [11, 12, 13, 14]]


def shuffled_paged(target, B, S, block_size, seed, spare=5):
    """A zeroed PagedKV of length S whose rows own randomly scattered blocks (plus spare ones)."""
    max_blocks = -(-S // block_size)
    num_blocks = B * max_blocks + spare
    table = torch.randperm(num_blocks, generator=gen(seed))[: B * max_blocks].view(B, max_blocks).to(torch.int32)
    return target.new_paged_kv_cache(B, S, block_size, num_blocks=num_blocks, block_table=table)


def assert_same_run(contiguous, paged):
    assert paged.tokens == contiguous.tokens
    assert paged.steps == contiguous.steps and paged.nodes == contiguous.nodes
    assert torch.equal(paged.state.cache_len, contiguous.state.cache_len)
    # every slot of every row, bit for bit (tree slots past cache_len included)
    assert torch.equal(paged.state.kv.to_contiguous(), contiguous.state.kv)


@pytest.fixture(scope="module")
def target():
    return random_target(vocab=97, hidden=64, layers=2, seed=0)


@pytest.mark.parametrize("block_size", (1, 5, 16))
def test_generate_paged_random_model(target, block_size):
    drafter = random_drafter(target)
    for prompts, (W, L) in ((PROMPTS_3, (3, 4)), (PROMPTS_3[:1], (2, 5))):
        B, new = len(prompts), 40
        S = max(map(len, prompts)) + new + 1 + W * (L - 1) + 3
        kw = dict(beam_width=W, beam_length=L)
        c = rx.generate(target, drafter, prompts, new, max_len=S, **kw)
        p = rx.generate(target, drafter, prompts, new, paged_kv=shuffled_paged(target, B, S, block_size, seed=B), **kw)
        assert_same_run(c, p)
        ar = rx.autoregressive_generate(target, prompts, new, paged_kv=shuffled_paged(target, B, S, block_size, 9))
        assert p.tokens == ar.tokens


@pytest.mark.parametrize("block_size", (1, 5))
def test_decode_paged_long_acceptance(target, block_size):
    # the oracle drafter is accepted in full (L tokens a step): paths cross block boundaries
    ar = rx.autoregressive_generate(target, PROMPTS_3, 40)
    ref_tokens = torch.tensor([r + [0] * 8 for r in ar.tokens])
    W, L = 3, 6
    S = 7 + 40 + 1 + W * (L - 1)
    for paged in (None, shuffled_paged(target, 3, S, block_size, seed=4)):
        state = _start(target, PROMPTS_3, 40, 1 + W * (L - 1), None, None if paged else S, None, paged)
        drafter = OracleDrafter(ref_tokens, state.num_out, 97)
        for _ in range(40):
            rx.decode_step(target, drafter, state, beam_width=W, beam_length=L)
        n = state.num_out.tolist()
        assert [state.out[b, : n[b]].tolist() for b in range(3)] == ar.tokens
        assert state.steps.tolist() == [-(-40 // L)] * 3
        if paged is None:
            contiguous_kv = state.kv
        else:
            assert torch.equal(state.kv.to_contiguous(), contiguous_kv)


def test_generate_paged_sampling(target):
    drafter = random_drafter(target, seed=3)
    S = 7 + 32 + 1 + 2 * 3 + 2
    kw = dict(beam_width=2, beam_length=4, temperature=0.8, top_k=20, top_p=0.95, seed=1234)
    c = rx.generate(target, drafter, PROMPTS_3, 32, max_len=S, **kw)
    p = rx.generate(target, drafter, PROMPTS_3, 32, paged_kv=shuffled_paged(target, 3, S, 5, seed=2), **kw)
    assert_same_run(c, p)
    assert c.tokens != rx.generate(target, drafter, PROMPTS_3, 32, max_len=S, **(kw | {"seed": 7})).tokens


@pytest.fixture(scope="module")
def shipped():
    from redrafter_ext.demo import CHECKPOINTS, load_models, load_prompt_ids

    target, drafter, tok, _ = load_models(CHECKPOINTS, random_weights=False)
    prompts = load_prompt_ids(tok, 3, 160, target.vocab_size)
    return target, drafter, [prompts[0], prompts[1][: len(prompts[1]) // 2], prompts[2]]


@pytest.mark.parametrize("B", (1, 3))
def test_generate_paged_shipped_model(shipped, B):
    target, drafter, prompts = shipped
    prompts = prompts[:B]
    eos = target.config.eos_token_id
    W, L, new = 2, 5, 32
    S = max(map(len, prompts)) + new + 1 + W * (L - 1)
    kw = dict(beam_width=W, beam_length=L, eos_id=eos)
    c = rx.generate(target, drafter, prompts, new, max_len=S, **kw)
    p = rx.generate(target, drafter, prompts, new, paged_kv=shuffled_paged(target, B, S, 16, seed=B), **kw)
    assert_same_run(c, p)
    assert p.tokens_per_step > 1.2  # long accepted paths
    if B == 3:
        assert len({len(x) for x in prompts}) == 3  # mixed prompt lengths
        ks = dict(kw, temperature=0.7, seed=5)
        c = rx.generate(target, drafter, prompts, 16, max_len=S, **ks)
        p = rx.generate(target, drafter, prompts, 16, paged_kv=shuffled_paged(target, B, S, 5, seed=6), **ks)
        assert_same_run(c, p)


@pytest.mark.parametrize("backend", ("native", "reference"))
def test_paged_decode_step_never_syncs(target, backend, monkeypatch):
    ops = {"native": rx.ops, "reference": rx.reference}[backend]
    paged = shuffled_paged(target, 3, 7 + 16 + 13, 5, seed=8)
    state = _start(target, PROMPTS_3, 16, 13, None, None, None, paged)
    steps_without_host_sync(monkeypatch, target, random_drafter(target), state, ops)


def test_paged_bad_input(target):
    d = random_drafter(target)
    paged = shuffled_paged(target, 3, 30, 5, seed=1)
    with pytest.raises(ValueError, match="paged_kv has 3 rows"):
        rx.generate(target, d, PROMPTS_3[:2], 8, paged_kv=paged)
    with pytest.raises(ValueError, match="max_len or paged_kv"):
        rx.generate(target, d, PROMPTS_3, 8, paged_kv=paged, max_len=30)
    with pytest.raises(ValueError, match="max_len=30 leaves no room"):
        rx.generate(target, d, PROMPTS_3, 20, paged_kv=paged)
    with pytest.raises(TypeError, match="block_table must have dtype int32"):
        PagedKV(paged.pages, paged.block_table.long())
    with pytest.raises(ValueError, match="pages must have shape"):
        PagedKV(paged.pages[0], paged.block_table)
    with pytest.raises(ValueError, match="max_len=31"):
        PagedKV(paged.pages, paged.block_table, 31)
    state = _start(target, PROMPTS_3, 8, 4, None, None, None, paged)
    state.kv = PagedKV(paged.pages.to(torch.int32), paged.block_table)
    with pytest.raises(TypeError, match="state.kv.pages must have dtype"):
        rx.decode_step(target, d, state, beam_width=2, beam_length=3)
    state.kv = PagedKV(paged.pages, paged.block_table, 9)
    with pytest.raises(ValueError, match=r"N = 1 \+ W\*\(L-1\) = 13 cache slots but the cache has S = 9"):
        rx.decode_step(target, d, state, beam_width=4, beam_length=4)


@pytest.mark.parametrize("cache_dtype", (torch.float32, torch.bfloat16))
def test_paged_tree_forward_bitwise(target, cache_dtype):
    # a prefill then a tree forward at mixed cache lengths: logits, hidden and every KV bit equal
    B, S, T = 3, 40, 10
    g = gen(21)
    prompts = torch.randint(0, 97, (B, 12), generator=g)
    lengths = torch.tensor([12, 5, 9], dtype=torch.int32)
    beams = torch.randint(0, 97, (B, 3, 4), generator=g)
    token, parent, depth, _, n = ref.build_trie(beams)
    mask = ref.tree_mask(parent, n)
    assert token.shape[1] == T
    kv = target.new_kv_cache(B, S, dtype=cache_dtype)
    paged = shuffled_paged(target, B, S, 3, seed=5)
    paged.pages = paged.pages.to(cache_dtype)
    outs = []
    for cache in (kv, paged):
        first = target.prefill(prompts, lengths, cache)
        outs.append(first + target(token, lengths[:, None] + depth, mask, lengths, cache))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert torch.equal(paged.to_contiguous(), kv)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the kernel is proven in the emulator)")
def test_cuda_device():
    for dtype, bs, B in ((torch.float32, 5, 3), (torch.bfloat16, 16, 7), (torch.float16, 1, 1)):
        inputs = paged_inputs(B, 6, bs, dtype, seed=B, D=64)
        p2, c2 = inputs[0].clone(), inputs[2].clone()
        ref.kv_compact_paged(p2, inputs[1], c2, inputs[3], inputs[4])
        p1, t1, c1, path1, acc1 = (t.cuda() for t in inputs)
        rx.ops.kv_compact_paged(p1, t1, c1, path1, acc1)
        assert torch.equal(c1.cpu(), c2) and torch.equal(p1.cpu().view(torch.uint8), p2.view(torch.uint8))
    torch.library.opcheck(torch.ops.redrafter.kv_compact_paged.default, (p1, t1, c1, path1, acc1))


def test_paged_cache_overflow_raises_naming_the_row(target):
    # max_len 11 < cache_len 7 + N 5 in row 0, while the row's blocks (capacity 30) have room: the
    # tree's last node would lie past the S slots attention reads and could not see itself
    d = random_drafter(target)
    paged = shuffled_paged(target, 3, 30, 5, seed=2)
    state = _start(target, PROMPTS_3, 4, 4, None, None, None, paged)
    state.kv = PagedKV(paged.pages, paged.block_table, 11)
    pages0, len0 = paged.pages.clone(), state.cache_len.clone()
    for ops in (rx.ops, rx.reference):
        with pytest.raises(ValueError, match=r"row 0: cache_len = 7.* = 5 tree slots.* needs 12 .* S = 11 \(room for 4\)"):
            rx.decode_step(target, d, state, beam_width=2, beam_length=3, ops=ops)
        assert torch.equal(paged.pages, pages0) and torch.equal(state.cache_len, len0)
    state.kv = PagedKV(paged.pages, paged.block_table, 12)  # exactly enough
    rx.decode_step(target, d, state, beam_width=2, beam_length=3)
