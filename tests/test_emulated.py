"""The ops both kernel emulators run, tested once per op and parametrised by backend: the CUDA kernels
(csrc/cuda, host side tests/emu/cuda_ops.py) and the Metal kernels (csrc/metal, host side
tests/emu/metal_ops.py), each run on the CPU and compared with ``redrafter_ext.reference``:
integers exactly, float scores within a tolerance.

Each case runs under several schedule seeds: the seed drives the order in which the emulated
threads run between barriers and the garbage in shared (threadgroup) memory, so a missing barrier
shows up as a wrong result. What only one backend has (its build, negative controls, the sanitized
run, verify_sample's float64-vs-float32 comparisons) stays in tests/test_cuda_emulated.py and
tests/test_metal_emulated.py. Under REDRAFTER_EMU_SANITIZE=1 only the CUDA backend runs.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np
import pytest
import torch
from cases import beam_inputs, gen, greedy_logits, kv_inputs, trie_beams
from emu import cuda_ops, emu_build, metal_build, metal_ops
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redrafter_ext import reference as ref

SANITIZE = os.environ.get("REDRAFTER_EMU_SANITIZE") == "1"
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Backend:
    """One emulator: its module, its host side (``ops``), the schedules it runs under, and the
    variants of an op's host path worth covering (keyword arguments of ``ops.<op>``)."""

    name: str
    emu: object
    ops: ModuleType
    seeds: tuple[int, ...]
    variants: dict[str, list[dict]] = field(default_factory=dict)

    def runs(self, op: str, *args, seeds: tuple[int, ...] | None = None):
        """Yields (label, result) of ``ops.<op>(emu, *args)`` for every seed and variant."""
        fn = getattr(self.ops, op)
        for seed, kw in itertools.product(seeds or self.seeds, self.variants.get(op, [{}])):
            self.emu.set_seed(seed)
            yield f"{self.name} seed {seed} {kw}", fn(self.emu, *args, **kw)


@pytest.fixture(scope="module", params=["cuda", "metal"])
def k(request) -> Backend:
    if request.param == "cuda":
        # one schedule is enough to find memory errors
        return Backend("cuda", emu_build.build(sanitize=SANITIZE), cuda_ops, (7,) if SANITIZE else (1, 2, 3),
                       {"verify_greedy": [{"strategy": 1}, {"strategy": 2}]})
    if SANITIZE:
        pytest.skip("the sanitized run covers the CUDA kernels")
    # donate=False: the path where MLX cannot reuse the input buffers (kv_copy first)
    return Backend("metal", metal_build.build(), metal_ops, (1, 2, 3),
                   {"kv_compact": [{"donate": True}, {"donate": False}]})


# ------------------------------------------------------------------------------------------------
# build_trie and tree_mask


def check_trie(k: Backend, beams):
    exp = ref.build_trie(beams)
    parent, n = exp[1], exp[4]
    for label, got in k.runs("build_trie", beams):
        for i, (a, b) in enumerate(zip(got, exp)):
            assert torch.equal(a, b), f"build_trie output {i} ({label})\n{a}\n{b}"
    for packed in (False, True):
        want = ref.tree_mask(parent, n, packed)
        for label, got in k.runs("tree_mask", parent, n, packed):
            assert torch.equal(got, want), f"tree_mask packed={packed} ({label})"


@pytest.mark.parametrize("B,W,L", list(itertools.product((1, 3, 7), (1, 2, 8, 64), (1, 2, 5, 16))))
def test_build_trie_and_tree_mask(k, B, W, L):
    shared, distinct = trie_beams(B, W, L)
    check_trie(k, shared)
    if W * L <= 128:
        check_trie(k, distinct)


def test_build_trie_edges(k):
    check_trie(k, torch.zeros(2, 3, 1, dtype=torch.int64))  # L = 1: the root only
    check_trie(k, torch.randint(0, 2, (2, 64, 17), generator=gen(3)))  # W*(L-1) = 1024: one full tile
    check_trie(k, torch.randint(0, 2, (2, 64, 18), generator=gen(3)))  # 1088: several tiles
    if k.name == "cuda":  # int64 ids compared at full width (the Metal host side casts ids to int32)
        check_trie(k, torch.full((1, 4, 3), 2**40 + 5))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 3), st.integers(1, 12), st.integers(1, 7), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_build_trie_and_tree_mask_hypothesis(k, B, W, L, vocab, seed):
    check_trie(k, torch.randint(0, vocab, (B, W, L), generator=gen(seed)))


def test_tree_mask_padding_and_bad_parents(k):
    parent = torch.tensor([[-1, 0, 1, 0, 7, 2, -1], [-1, 0, 0, 2, 2, 3, 5]], dtype=torch.int32)
    n = torch.tensor([5, 7], dtype=torch.int32)
    fixed = parent.clone()
    fixed[0, 4] = -1  # node 4's parent 7 is not a lower index: the walk stops there (the CPU op raises)
    for packed in (False, True):
        for label, got in k.runs("tree_mask", parent, n, packed):
            assert torch.equal(got, ref.tree_mask(fixed, n, packed)), label


# ------------------------------------------------------------------------------------------------
# verify_greedy


def check_verify(k: Backend, logits, beams, beam_node):
    exp = ref.verify_greedy(logits, beams, beam_node)
    for label, got in k.runs("verify_greedy", logits, beams, beam_node):
        for i, (a, b) in enumerate(zip(got, exp)):
            assert torch.equal(a, b), f"verify_greedy output {i} ({label})\n{a}\n{b}"
    return exp[0]


# the union of the two emulators' former tables: W 1..64, L 1..16, V up to 128256, every dtype
VERIFY_CASES = [(1, 1, 1, 111, torch.float32), (1, 1, 2, 111, torch.float32), (3, 2, 5, 111, torch.bfloat16),
                (7, 8, 5, 111, torch.float16), (1, 64, 5, 111, torch.float32), (3, 64, 2, 111, torch.bfloat16),
                (3, 40, 2, 111, torch.bfloat16), (1, 8, 16, 111, torch.float32), (1, 8, 5, 32000, torch.float16),
                (1, 2, 3, 128256, torch.bfloat16)]


@pytest.mark.parametrize("B,W,L,V,dtype", VERIFY_CASES)
def test_verify_greedy(k, B, W, L, V, dtype):
    beams = torch.randint(0, 4, (B, W, L), generator=gen(W + L))
    beam_node = ref.build_trie(beams)[3]
    seen = set()
    for j, follow in enumerate((0.0, 0.9)):
        logits = greedy_logits(beams, beam_node, V, follow, seed=j + V, dtype=dtype)
        idx = (torch.int32, torch.int64)[j]
        seen |= set(check_verify(k, logits, beams.to(idx), beam_node.to(idx)).tolist())
    if L > 2 and B * W > 2:
        assert len(seen) >= 2


@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_greedy_ties_nan_inf(k, dtype):
    beams = torch.randint(0, 3, (3, 4, 4), generator=gen(8))
    beam_node = ref.build_trie(beams)[3].to(beams.dtype)
    logits = torch.randint(0, 2, (3, 13, 3), generator=gen(9)).to(dtype)
    check_verify(k, logits, beams, beam_node)
    logits[1, 0, 2] = float("nan")
    logits[2, :, :] = float("-inf")
    check_verify(k, logits, beams, beam_node)


# ------------------------------------------------------------------------------------------------
# kv_compact


def check_kv(k: Backend, kv, cache_len, path, acc):
    k2, c2 = kv.clone(), cache_len.clone()
    ref.kv_compact(k2, c2, path, acc)
    for label, (k1, c1) in k.runs("kv_compact", kv, cache_len, path, acc):
        assert torch.equal(c1, c2), label
        assert np.array_equal(cuda_ops.np_of(k1), cuda_ops.np_of(k2)), label


@pytest.mark.parametrize("B", (1, 3, 7))
@pytest.mark.parametrize("L", (1, 2, 5, 16))
@pytest.mark.parametrize("dtype", FLOATS)
def test_kv_compact(k, B, L, dtype):
    for j, D in enumerate((1, 64, 3, 4)):  # 2/4-byte slots, 16-byte vectors, odd sizes
        idx = (torch.int32, torch.int64)[j % 2]
        check_kv(k, *kv_inputs(2, B, 3, 40, D, L, dtype, seed=j * 10 + B + L, idx=idx))


def test_kv_compact_edges(k):
    kv, cache_len, path, acc = kv_inputs(1, 4, 2, 40, 8, 20, torch.float32, seed=1)
    acc[:] = torch.tensor([-1, 19, 0, 18])  # > 16 positions: two register chunks
    path[1] = torch.arange(20)
    path[3, :19] = torch.arange(19) + 20
    path[2, 0] = 0
    cache_len[:] = torch.tensor([40, 0, 39, 1], dtype=torch.int32)
    check_kv(k, kv, cache_len, path, acc)
    # out-of-range rows are left untouched (the torch CPU op and the MLX wrapper raise first)
    kv, cache_len, path, acc = kv_inputs(1, 3, 2, 12, 4, 4, torch.float32, seed=2)
    acc[:] = torch.tensor([7, 2, 1])
    path[1, :3] = torch.tensor([0, 0, 5])  # path[1] < 1
    path[2, :2] = torch.tensor([0, 1])
    cache_len[2] = 3
    for label, (k1, c1) in k.runs("kv_compact", kv, cache_len, path, acc):
        assert c1.tolist() == [int(cache_len[0]), int(cache_len[1]), 5], label
        assert torch.equal(k1[:, :, :2], kv[:, :, :2]), label


# ------------------------------------------------------------------------------------------------
# beam_topk


def check_beam_topk(k: Backend, args, atol=1e-5, seeds=None):
    exp = ref.beam_topk(*args)
    for label, got in k.runs("beam_topk", *args, seeds=seeds):
        assert torch.equal(got[3], exp[3]), f"parent ({label})\n{got[3]}\n{exp[3]}"
        assert torch.equal(got[1], exp[1]), f"tokens ({label})"
        assert torch.equal(got[2], exp[2]), f"state ({label})"
        torch.testing.assert_close(got[0], exp[0], atol=atol, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B,W,L,D", [(1, 1, 2, 1), (3, 2, 5, 64), (7, 8, 5, 1), (1, 64, 16, 64), (1, 64, 16, 3),
                                     (3, 64, 2, 1), (3, 17, 2, 1)])
@pytest.mark.parametrize("step", (1, "last"))
def test_beam_topk_small_vocab(k, B, W, L, D, dtype, step):
    step = L - 1 if step == "last" else step
    check_beam_topk(k, beam_inputs(B, W, 111, L, D, dtype, step, seed=B + W + L + step))


@pytest.mark.parametrize(
    "B,W,V,dtype",
    [(1, 8, 32000, torch.float32), (3, 2, 32000, torch.bfloat16), (1, 16, 32000, torch.float16),
     (1, 64, 32000, torch.float16), (1, 4, 128256, torch.bfloat16)],
)
def test_beam_topk_big(k, B, W, V, dtype):
    check_beam_topk(k, beam_inputs(B, W, V, 3, 4, dtype, 2, seed=V + W), seeds=k.seeds[:2] if V > 100000 else None)


@pytest.mark.parametrize("dtype", FLOATS)
def test_beam_topk_ties(k, dtype):
    # integer logits: exact ties everywhere, across splits and beams (ties to the lower flat index)
    B, W, V = 2, 8, 5000
    logits = torch.randint(0, 3, (B, W, V), generator=gen(5)).to(dtype)
    tokens = torch.zeros(B, W, 3, dtype=torch.int32)
    check_beam_topk(k, (logits, torch.zeros(B, W), tokens, torch.randn(B, W, 2).to(dtype), 1))
    # W > V: a row contributes only V candidates
    check_beam_topk(k, beam_inputs(2, 8, 5, 3, 2, dtype, 2, seed=6))
    # few finite logits: -inf candidates fill the top-W by index
    logits = torch.full((1, 4, 3000), float("-inf"))
    logits[0, :, 2500] = 1.0
    check_beam_topk(k, (logits.to(dtype), torch.zeros(1, 4), tokens[:1, :4], torch.randn(1, 4, 2), 1))


def test_beam_topk_nonfinite(k):
    logits, scores, tokens, state, step = beam_inputs(3, 4, 3000, 3, 2, torch.float32, 2, seed=9)
    logits[0, 1, 7] = float("nan")
    logits[1, 2, :] = float("-inf")
    logits[2, 0, 2999] = float("inf")
    scores[1, 0] = float("-inf")
    check_beam_topk(k, (logits, scores, tokens, state, step))
    scores[2, 3] = float("inf")
    check_beam_topk(k, (logits, scores, tokens, state, step))


def test_beam_topk_rounding_ties(k):
    # large scores: f = s + ((x - m) - logsum) rounds different x to equal f; the reference orders
    # them by index, which can put a lower-x element (beyond the per-split slack) into the top-W
    logits = torch.randn(1, 4, 6000, generator=gen(11)) * 1e-3
    check_beam_topk(k, (logits, torch.full((1, 4), 3.0e4), torch.zeros(1, 4, 3, dtype=torch.int64),
                        torch.randn(1, 4, 1), 1))


# ------------------------------------------------------------------------------------------------
# negative controls: the emulator must catch these bugs


def test_negative_missing_barrier(k):
    expected = (np.arange(64)[::-1] * 7 + 1).astype(np.int32)
    caught = 0
    for seed in range(8):
        k.emu.set_seed(seed)
        caught += not np.array_equal(k.ops.negative(k.emu, "missing_barrier"), expected)
    assert caught >= 6, f"the missing barrier went unnoticed under {8 - caught} of 8 schedules"


@pytest.mark.parametrize(
    "which,pattern",
    [
        ("divergent_barrier", "different __syncthreads"),
        ("exit_before_barrier", "exited"),
        ("divergent_collective", "exited|deadlock"),  # a warp shuffle / simd-group op
    ],
)
def test_negative_divergence(k, which, pattern):
    for seed in k.seeds:
        k.emu.set_seed(seed)
        with pytest.raises(RuntimeError, match=pattern):
            k.ops.negative(k.emu, which)
