"""The Metal kernels (csrc/metal/*.metal) run on the CPU through the host shim (tests/shim/metal_shim.h
plus the source rewrite of tests/emu/metal_build.py) and compared with ``redrafter_ext.reference``:
integers exactly, float scores within a per-dtype tolerance.

Each kernel runs under several schedule seeds: the seed drives the order in which the emulated
threads of a threadgroup run between barriers and simd collectives, and the garbage that fills
threadgroup memory when a group starts, so a missing barrier shows up as a wrong result (see the
negative controls). The host side (buffer indices, parameter blocks, grid sizes) is
tests/emu/metal_ops.py, which mirrors csrc/metal/dispatch.cpp (untested: no Metal here).
"""

from __future__ import annotations

import itertools
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cases import beam_inputs, gen, greedy_logits, kv_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redrafter_ext import reference as ref

sys.path.insert(0, str(Path(__file__).parent / "emu"))
import metal_build  # noqa: E402
import metal_ops as mo  # noqa: E402

SEEDS = (1, 2, 3)
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def emu():
    return metal_build.build()


def run_seeds(emu, fn, *args, seeds=SEEDS, **kw):
    for seed in seeds:
        emu.set_seed(seed)
        yield seed, fn(emu, *args, **kw)


# ------------------------------------------------------------------------------------------------
# every .metal compiles through the shim (the module build, one object per file) and registers the
# kernels that dispatch.cpp names; dispatch.cpp parses against MLX's headers


@pytest.mark.parametrize("path", metal_build.kernel_sources(), ids=lambda p: p.name)
def test_metal_source_registers_its_kernels(emu, path):
    text = path.read_text()
    names = set(re.findall(r"\[\[kernel\]\]\s*void\s+(\w+)", text)) - set(re.findall(r"template <[^>]*>\s*\[\[kernel\]\]\s*void\s+(\w+)", text))
    names |= set(re.findall(r'instantiate_kernel\("(\w+)"', text))
    assert names and names <= set(emu.kernels()), sorted(names - set(emu.kernels()))


def test_kernel_names(emu):
    names = set(emu.kernels())
    expected = {"tree_mask_bool", "tree_mask_packed", "build_trie", "kv_advance", "beam_topk_merge"}
    expected |= {f"kv_compact_{n}" for n in (16, 8, 4, 2, 1)} | {f"kv_copy_{n}" for n in (16, 8, 4, 2, 1)}
    for d in ("float32", "float16", "bfloat16"):
        expected |= {f"verify_greedy_{d}", f"verify_sample_{d}", f"beam_topk_rows_{d}"}
    assert expected <= names, sorted(expected - names)
    dispatch = (Path(__file__).parents[1] / "csrc" / "metal" / "dispatch.cpp").read_text()
    for n in ("tree_mask_bool", "tree_mask_packed", "build_trie", "kv_advance", "beam_topk_merge", "kv_compact_",
              "kv_copy_", "verify_greedy_", "verify_sample_", "beam_topk_rows_", "redrafter_ext_mlx"):
        assert f'"{n}' in dispatch, n


def test_dispatch_cpp_parses_against_mlx_headers():
    pytest.importorskip("mlx.core")
    r = metal_build.check_dispatch_syntax()
    assert r.returncode == 0, r.stderr[-4000:]


# ------------------------------------------------------------------------------------------------
# build_trie and tree_mask


def check_trie(emu, beams):
    exp = ref.build_trie(beams)
    parent, n = exp[1], exp[4]
    for seed, got in run_seeds(emu, mo.build_trie, beams):
        for k, (a, b) in enumerate(zip(got, exp)):
            assert torch.equal(a, b), f"build_trie output {k} (seed {seed})\n{a}\n{b}"
    for packed in (False, True):
        want = ref.tree_mask(parent, n, packed)
        for seed, got in run_seeds(emu, mo.tree_mask, parent, n, packed):
            assert torch.equal(got, want), f"tree_mask packed={packed} seed {seed}"


@pytest.mark.parametrize("B,W,L", list(itertools.product((1, 3, 7), (1, 2, 8, 64), (1, 2, 5, 16))))
def test_build_trie_and_tree_mask(emu, B, W, L):
    g = gen(B * 1000 + W * 10 + L)
    check_trie(emu, torch.randint(0, 3, (B, W, L), generator=g, dtype=torch.int32))  # heavy sharing
    if W * L <= 128:
        check_trie(emu, torch.randint(0, 32000, (B, W, L), generator=g))  # no sharing


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 3), st.integers(1, 12), st.integers(1, 7), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_build_trie_and_tree_mask_hypothesis(emu, B, W, L, vocab, seed):
    check_trie(emu, torch.randint(0, vocab, (B, W, L), generator=gen(seed)))


def test_build_trie_many_tiles(emu):
    check_trie(emu, torch.randint(0, 2, (2, 64, 18), generator=gen(3)))  # W*(L-1) = 1088 > 1024 threads


def test_tree_mask_padding_and_bad_parents(emu):
    parent = torch.tensor([[-1, 0, 1, 0, 7, 2, -1], [-1, 0, 0, 2, 2, 3, 5]], dtype=torch.int32)
    n = torch.tensor([5, 7], dtype=torch.int32)
    fixed = parent.clone()
    fixed[0, 4] = -1  # node 4's parent 7 is not a lower index: the walk stops there
    for packed in (False, True):
        for seed, got in run_seeds(emu, mo.tree_mask, parent, n, packed):
            assert torch.equal(got, ref.tree_mask(fixed, n, packed)), seed


# ------------------------------------------------------------------------------------------------
# verify_greedy


def check_verify(emu, logits, beams, beam_node):
    exp = ref.verify_greedy(logits, beams, beam_node)
    for seed, got in run_seeds(emu, mo.verify_greedy, logits, beams, beam_node):
        for k, (a, b) in enumerate(zip(got, exp)):
            assert torch.equal(a, b), f"verify_greedy output {k} (seed {seed})\n{a}\n{b}"
    return exp[0]


@pytest.mark.parametrize(
    "B,W,L,V,dtype",
    [
        (1, 1, 1, 111, torch.float32),
        (1, 1, 2, 111, torch.float32),
        (3, 2, 5, 111, torch.bfloat16),
        (7, 8, 5, 111, torch.float16),
        (1, 64, 5, 111, torch.float32),
        (3, 40, 2, 111, torch.bfloat16),
        (1, 8, 16, 111, torch.float32),
        (1, 8, 5, 32000, torch.float16),
    ],
)
def test_verify_greedy(emu, B, W, L, V, dtype):
    beams = torch.randint(0, 4, (B, W, L), generator=gen(W + L))
    beam_node = ref.build_trie(beams)[3]
    seen = set()
    for k, follow in enumerate((0.0, 0.9)):
        logits = greedy_logits(beams, beam_node, V, follow, seed=k + V, dtype=dtype)
        seen |= set(check_verify(emu, logits, beams, beam_node).tolist())
    if L > 2 and B * W > 2:
        assert len(seen) >= 2


@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_greedy_ties_nan_inf(emu, dtype):
    beams = torch.randint(0, 3, (3, 4, 4), generator=gen(8))
    beam_node = ref.build_trie(beams)[3]
    logits = torch.randint(0, 2, (3, 13, 3), generator=gen(9)).to(dtype)
    check_verify(emu, logits, beams, beam_node)
    logits[1, 0, 2] = float("nan")
    logits[2, :, :] = float("-inf")
    check_verify(emu, logits, beams, beam_node)


# ------------------------------------------------------------------------------------------------
# kv_compact


def check_kv(emu, kv, cache_len, path, acc):
    k2, c2 = kv.clone(), cache_len.clone()
    ref.kv_compact(k2, c2, path, acc)
    for donate in (True, False):
        for seed, (k1, c1) in run_seeds(emu, mo.kv_compact, kv, cache_len, path, acc, donate=donate):
            assert torch.equal(c1, c2), seed
            assert np.array_equal(mo.np_of(k1), mo.np_of(k2)), f"seed {seed} donate {donate}"


@pytest.mark.parametrize("B", (1, 3, 7))
@pytest.mark.parametrize("L", (1, 2, 5, 16))
@pytest.mark.parametrize("dtype", FLOATS)
def test_kv_compact(emu, B, L, dtype):
    for k, D in enumerate((1, 64, 3, 4)):  # 2/4-byte units, 16-byte vectors, odd sizes
        check_kv(emu, *kv_inputs(2, B, 3, 40, D, L, dtype, seed=k * 10 + B + L))


def test_kv_compact_edges(emu):
    kv, cache_len, path, acc = kv_inputs(1, 4, 2, 40, 8, 20, torch.float32, seed=1)
    acc[:] = torch.tensor([-1, 19, 0, 18])  # > 16 positions: two register chunks
    path[1] = torch.arange(20)
    path[3, :19] = torch.arange(19) + 20
    path[2, 0] = 0
    cache_len[:] = torch.tensor([40, 0, 39, 1], dtype=torch.int32)
    check_kv(emu, kv, cache_len, path, acc)
    # out-of-range rows are left untouched (the MLX wrapper's checks would raise first)
    kv, cache_len, path, acc = kv_inputs(1, 3, 2, 12, 4, 4, torch.float32, seed=2)
    acc[:] = torch.tensor([7, 2, 1])
    path[1, :3] = torch.tensor([0, 0, 5])  # path[1] < 1
    path[2, :2] = torch.tensor([0, 1])
    cache_len[2] = 3
    emu.set_seed(1)
    k1, c1 = mo.kv_compact(emu, kv, cache_len, path, acc)
    assert c1.tolist() == [int(cache_len[0]), int(cache_len[1]), 5]
    assert torch.equal(k1[:, :, :2], kv[:, :, :2])


# ------------------------------------------------------------------------------------------------
# negative controls: the shim must catch these bugs


def test_negative_missing_barrier(emu):
    expected = (np.arange(64)[::-1] * 7 + 1).astype(np.int32)
    caught = 0
    for seed in range(8):
        for name in ("with_barrier", "missing_barrier"):
            out = mo.poison(64)
            emu.set_seed(seed)
            emu.dispatch(name, [out], 1, 64)
            if name == "with_barrier":
                assert np.array_equal(out, expected)
            else:
                caught += not np.array_equal(out, expected)
    assert caught >= 6, f"the missing barrier went unnoticed under {8 - caught} of 8 schedules"


@pytest.mark.parametrize(
    "which,pattern",
    [
        ("divergent_barrier", "different __syncthreads"),
        ("exit_before_barrier", "exited"),
        ("divergent_simd", "exited|deadlock"),
    ],
)
def test_negative_divergence(emu, which, pattern):
    for seed in SEEDS:
        emu.set_seed(seed)
        with pytest.raises(RuntimeError, match=pattern):
            emu.dispatch(which, [mo.poison(64)], 1, 64)


def test_negative_unbound_buffer(emu):
    with pytest.raises(RuntimeError, match="buffer 0 is read but was not set"):
        emu.dispatch("with_barrier", [None], 1, 32)


# ------------------------------------------------------------------------------------------------
# beam_topk


def check_beam_topk(emu, args, atol=1e-5, seeds=SEEDS):
    exp = ref.beam_topk(*args)
    for seed, got in run_seeds(emu, mo.beam_topk, *args, seeds=seeds):
        assert torch.equal(got[3], exp[3]), f"parent (seed {seed})\n{got[3]}\n{exp[3]}"
        assert torch.equal(got[1], exp[1]), f"tokens (seed {seed})"
        assert torch.equal(got[2], exp[2]), f"state (seed {seed})"
        torch.testing.assert_close(got[0], exp[0], atol=atol, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B,W,L,D", [(1, 1, 2, 1), (3, 2, 5, 64), (7, 8, 5, 1), (1, 64, 16, 3), (3, 17, 2, 1)])
@pytest.mark.parametrize("step", (1, "last"))
def test_beam_topk_small_vocab(emu, B, W, L, D, dtype, step):
    step = L - 1 if step == "last" else step
    check_beam_topk(emu, beam_inputs(B, W, 111, L, D, dtype, step, seed=B + W + L + step))


@pytest.mark.parametrize("B,W,dtype", [(1, 8, torch.float32), (3, 2, torch.bfloat16), (1, 16, torch.float16)])
def test_beam_topk_32000(emu, B, W, dtype):
    check_beam_topk(emu, beam_inputs(B, W, 32000, 3, 4, dtype, 2, seed=W))


@pytest.mark.parametrize("dtype", FLOATS)
def test_beam_topk_ties(emu, dtype):
    # integer logits: exact ties everywhere, across beams (ties to the lower flat index)
    B, W, V = 2, 8, 500
    logits = torch.randint(0, 3, (B, W, V), generator=gen(5)).to(dtype)
    tokens = torch.zeros(B, W, 3, dtype=torch.int32)
    check_beam_topk(emu, (logits, torch.zeros(B, W), tokens, torch.randn(B, W, 2).to(dtype), 1))
    # W > V: a row contributes only V candidates
    check_beam_topk(emu, beam_inputs(2, 8, 5, 3, 2, dtype, 2, seed=6))
    # few finite logits: -inf candidates fill the top-W by index
    logits = torch.full((1, 4, 300), float("-inf"))
    logits[0, :, 250] = 1.0
    check_beam_topk(emu, (logits.to(dtype), torch.zeros(1, 4), tokens[:1, :4], torch.randn(1, 4, 2), 1))


def test_beam_topk_nonfinite(emu):
    logits, scores, tokens, state, step = beam_inputs(3, 4, 300, 3, 2, torch.float32, 2, seed=9)
    logits[0, 1, 7] = float("nan")
    logits[1, 2, :] = float("-inf")
    logits[2, 0, 299] = float("inf")
    scores[1, 0] = float("-inf")
    check_beam_topk(emu, (logits, scores, tokens, state, step))
    scores[2, 3] = float("inf")
    check_beam_topk(emu, (logits, scores, tokens, state, step))


def test_beam_topk_rounding_ties(emu):
    # large scores: f = s + ((x - m) - logsum) rounds different x to equal f, ordered by index
    g = gen(11)
    logits = torch.randn(1, 4, 600, generator=g) * 1e-3
    check_beam_topk(emu, (logits, torch.full((1, 4), 3.0e4), torch.zeros(1, 4, 3, dtype=torch.int64),
                          torch.randn(1, 4, 1), 1))


# ------------------------------------------------------------------------------------------------
# verify_sample: float32 on Metal, so exact equality with the float64 reference is asserted on the
# rows whose reference result does not change when every uniform moves by +-DELTA (no decision
# threshold near a uniform: float32 group sums are accurate to ~1e-6 of the mass); the other rows
# are counted and must be a minority (at V = 32000 the final draw's tokens are ~3e-5 wide).
DELTA = 3e-6


def sample_inputs(B, W, L, V, dtype, follow, seed):
    g = gen(seed)
    beams = torch.randint(0, 4, (B, W, L), generator=g)
    beam_node = ref.build_trie(beams)[3]
    logits = greedy_logits(beams, beam_node, V, follow, seed, torch.float32)
    # the followed token gets a probability that does not vanish with V (some drafts accepted)
    logits = torch.where(logits == 10.0, 3.0 + math.log(V), logits * 0.5)
    accept_u = torch.rand(B, max(L - 1, 0), W, generator=g)
    sample_u = torch.rand(B, generator=g)
    return logits.to(dtype), beams, beam_node, accept_u, sample_u


def check_sample(emu, args, temperature, top_k, top_p, seeds=SEEDS):
    logits, beams, beam_node, accept_u, sample_u = args
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p)
    exp = ref.verify_sample(*args, **kw)
    stable = torch.ones(beams.shape[0], dtype=torch.bool)
    for delta in (-DELTA, DELTA):
        moved = ref.verify_sample(logits, beams, beam_node, (accept_u + delta).clamp(0, 1 - 2**-24),
                                  (sample_u + delta).clamp(0, 1 - 2**-24), **kw)
        for a, b in zip(moved, exp):
            stable &= (a == b).reshape(a.shape[0], -1).all(dim=1)
    for seed, got in run_seeds(emu, mo.verify_sample, *args, seeds=seeds, **kw):
        for k, (a, b) in enumerate(zip(got, exp)):
            assert torch.equal(a[stable], b[stable]), f"verify_sample output {k} (seed {seed})\n{a}\n{b}\n{stable}"
    return exp[0], int(stable.sum())


@pytest.mark.parametrize(
    "B,W,L,V,dtype,temperature,top_k,top_p",
    [
        (1, 1, 1, 111, torch.float32, 1.0, 0, 1.0),
        (3, 2, 5, 111, torch.float32, 1.0, 0, 1.0),
        (7, 8, 5, 111, torch.float16, 0.7, 0, 0.9),
        (3, 4, 4, 111, torch.bfloat16, 1.5, 5, 1.0),
        (3, 8, 3, 111, torch.float32, 1.0, 50, 0.5),
        (1, 16, 5, 111, torch.float32, 0.5, 0, 0.8),
        (3, 4, 3, 32000, torch.float32, 1.0, 0, 1.0),
        (3, 4, 3, 32000, torch.bfloat16, 0.8, 40, 0.95),
    ],
)
def test_verify_sample(emu, B, W, L, V, dtype, temperature, top_k, top_p):
    seen, used, total = set(), 0, 0
    for k, follow in enumerate((0.3, 0.95)):
        args = sample_inputs(B, W, L, V, dtype, follow, seed=100 * k + B + W + L + V)
        acc, n = check_sample(emu, args, temperature, top_k, top_p, seeds=SEEDS)
        seen |= set(acc.tolist())
        used, total = used + n, total + B
    assert used >= total / 2, f"only {used} of {total} rows away from a threshold"
    if L > 2 and B * W > 2:
        assert len(seen) >= 2


def test_verify_sample_greedy_and_ties(emu):
    args = sample_inputs(3, 4, 4, 111, torch.float32, 0.9, seed=4)
    for seed, got in run_seeds(emu, mo.verify_sample, *args, temperature=0.0):
        for a, b in zip(got, ref.verify_greedy(*args[:3])):
            assert torch.equal(a, b), seed
    # a flat distribution: every p ties, top-p keeps a prefix of the ties in index order
    logits, beams, beam_node, accept_u, sample_u = args
    check_sample(emu, (torch.zeros_like(logits), beams, beam_node, accept_u, sample_u), 1.0, 0, 0.3)
    check_sample(emu, (torch.zeros_like(logits), beams, beam_node, accept_u, sample_u), 1.0, 7, 1.0)


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 0.9)])
def test_verify_sample_nonfinite_rows(emu, top_k, top_p):
    # a NaN logit or an all -inf row makes the reference's p NaN: every child is rejected and the
    # next token is 0; the kernel reaches the same outputs
    logits, beams, beam_node, accept_u, sample_u = sample_inputs(3, 4, 3, 111, torch.float32, 0.9, seed=12)
    logits[0, 0, 5] = float("nan")
    logits[1, 0, :] = float("-inf")
    check_sample(emu, (logits, beams, beam_node, accept_u, sample_u), 1.0, top_k, top_p)
