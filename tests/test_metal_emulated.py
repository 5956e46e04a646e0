"""The Metal kernels (csrc/metal/*.metal) run on the CPU through the host shim (tests/shim/metal_shim.h
plus the source rewrite of tests/emu/metal_build.py) and compared with ``redrafter_ext.reference``:
integers exactly, float scores within a per-dtype tolerance. The cases the CUDA emulator shares are
in tests/test_emulated.py; here what only Metal has (the kernel registry and dispatch.cpp, the
float32 verify_sample, the negative controls).

Each kernel runs under several schedule seeds: the seed drives the order in which the emulated
threads of a threadgroup run between barriers and simd collectives, and the garbage that fills
threadgroup memory when a group starts, so a missing barrier shows up as a wrong result (see the
negative controls). The host side (buffer indices, parameter blocks, grid sizes) is
tests/emu/metal_ops.py, which mirrors csrc/metal/dispatch.cpp (untested: no Metal here).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from cases import gen, greedy_logits, lookup_cases, lookup_inputs, ngram_lookup_expected
from emu import metal_build
from emu import metal_ops as mo
from hypothesis import HealthCheck, given, settings

from redrafter_ext import reference as ref

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
    expected = {"tree_mask_bool", "tree_mask_packed", "build_trie", "kv_compact_advance", "beam_topk_merge",
                "ngram_lookup"}
    expected |= {f"kv_compact_{n}" for n in (16, 8, 4, 2, 1)} | {f"kv_copy_{n}" for n in (16, 8, 4, 2, 1)}
    for d in ("float32", "float16", "bfloat16"):
        expected |= {f"verify_greedy_{d}", f"verify_sample_{d}", f"beam_topk_rows_{d}"}
    assert expected <= names, sorted(expected - names)
    dispatch = (Path(__file__).parents[1] / "csrc" / "metal" / "dispatch.cpp").read_text()
    for n in ("tree_mask_bool", "tree_mask_packed", "build_trie", "kv_compact_advance", "beam_topk_merge", "kv_compact_",
              "kv_copy_", "verify_greedy_", "verify_sample_", "beam_topk_rows_", "ngram_lookup", "redrafter_ext_mlx"):
        assert f'"{n}' in dispatch, n


def test_dispatch_cpp_parses_against_mlx_headers():
    pytest.importorskip("mlx.core")
    r = metal_build.check_dispatch_syntax()
    assert r.returncode == 0, r.stderr[-4000:]


# ------------------------------------------------------------------------------------------------
# negative controls: the shim must catch these bugs


# (the missing barrier and the divergent ones: tests/test_emulated.py)


def test_with_barrier(emu):
    # the positive control of the missing barrier: the same kernel with its barrier is right
    expected = (np.arange(64)[::-1] * 7 + 1).astype(np.int32)
    for seed in range(8):
        out = mo.poison(64)
        emu.set_seed(seed)
        emu.dispatch("with_barrier", [out], 1, 64)
        assert np.array_equal(out, expected), seed


def test_negative_unbound_buffer(emu):
    with pytest.raises(RuntimeError, match="buffer 0 is read but was not set"):
        emu.dispatch("with_barrier", [None], 1, 32)


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


# ------------------------------------------------------------------------------------------------
# ngram_lookup (only Metal's: the CUDA kernel's emulated cases are in tests/test_cuda_emulated.py)


def check_lookup(emu, tokens, length, max_n, m, seeds=SEEDS, threads=None):
    exp = ref.ngram_lookup(tokens, length, max_n, m)
    assert torch.equal(exp, ngram_lookup_expected(tokens, length, max_n, m))  # the oracle itself
    for seed, got in run_seeds(emu, mo.ngram_lookup, tokens, length, max_n, m, seeds=seeds, threads=threads):
        assert torch.equal(got, exp), f"ngram_lookup max_n={max_n} m={m} threads={threads} (seed {seed})\n{got}\n{exp}"
    return exp


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lookup_inputs())
def test_ngram_lookup_hypothesis(emu, args):
    check_lookup(emu, *args, seeds=(1, 2))


# S = 300 needs more than one threadgroup width of candidate ends per thread (256 threads at most)
@pytest.mark.parametrize("S", (1, 2, 33, 300, 2048))
@pytest.mark.parametrize("B", (1, 3, 7))
@pytest.mark.parametrize("vocab,dtype", [(3, torch.int32), (3, torch.int64), (32000, torch.int64)])
def test_ngram_lookup_sizes(emu, B, S, vocab, dtype):
    found = 0
    for k, (max_n, m) in enumerate([(1, 1), (2, 4), (3, 9), (4, 5)]):
        tokens, length = lookup_cases(1000 * B + S + k, B, S, vocab, dtype)
        if S >= 33:  # row 0 (length S) ends with a copy of an early span: a long key occurs
            tokens[0, S - 3:] = tokens[0, 1:4].clone()
        exp = check_lookup(emu, tokens, length.to((torch.int32, torch.int64)[k % 2]), max_n, m)
        found += int((exp[:, 0] >= 0).sum())
    if S >= 33:
        assert found > 0  # some rows matched (the planted repeats)


@pytest.mark.parametrize("threads", (32, 96, 256, 512, 1024))
def test_ngram_lookup_any_threadgroup_size(emu, threads):
    # a multiple of 32 that is not a power of two, and more threads than the reduction's 256 slots
    for S in (5, 300, 700):
        tokens, length = lookup_cases(S + threads, 3, S, 3, torch.int32)
        check_lookup(emu, tokens, length, 4, 7, threads=threads)


def test_ngram_lookup_ties_periods_and_clamped_lengths(emu):
    S = 600
    tokens = torch.zeros(5, S, dtype=torch.int64)  # row 0: one token repeated (every end ties)
    tokens[1] = torch.arange(S) % 7  # period 7: the latest full-key match is 7 back
    tokens[2] = torch.arange(S)  # all distinct: no occurrence
    tokens[3, :] = torch.arange(S) % 2
    tokens[3, 400] = 5  # the key's last token occurs once, at the end: no occurrence
    tokens[4] = torch.randint(0, 3, (S,), generator=gen(7))
    length = torch.tensor([S, S, S, 401, 299])
    for max_n, m in [(1, 3), (4, 9), (3, 20)]:
        exp = check_lookup(emu, tokens, length, max_n, m)
        assert exp[0].tolist() == [0] * m and (exp[2] == -1).all() and (exp[3] == -1).all()
    # lengths outside [0, S] are clamped into it (the values are not known before evaluation)
    bad = torch.tensor([-5, S + 1, 10**6, 0, 1])
    exp = ref.ngram_lookup(tokens, bad.clamp(0, S), 3, 6)
    for seed, got in run_seeds(emu, mo.ngram_lookup, tokens, bad, 3, 6):
        assert torch.equal(got, exp), seed
    assert mo.ngram_lookup(emu, tokens[:0], length[:0], 2, 3).shape == (0, 3)
