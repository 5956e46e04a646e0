"""The CUDA kernels (csrc/cuda/*.cu) run on the CPU through the host shim (tests/shim) and compared
with ``redrafter_ext.reference``: integers exactly, float scores within a per-dtype tolerance. The
cases the Metal emulator shares are in tests/test_emulated.py; here what only CUDA has (the lazy
verify_greedy walk on arbitrary nodes, the float64 verify_sample, the negative controls, ASan).

Each kernel runs under several schedule seeds: the seed drives the order in which the emulated
threads of a block run between synchronisation points and the garbage that fills shared memory
before each block, so a missing barrier shows up as a wrong result (see the negative controls).
The module is built with g++ by tests/emu/emu_build.py (cached under tests/.emu_build). Setting
REDRAFTER_EMU_SANITIZE=1 loads the ASan+UBSan build instead (test_sanitized runs this file and the
CUDA half of test_emulated.py so).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cases import gen, lookup_cases, lookup_inputs, ngram_lookup_expected
from emu import cuda_ops as co
from emu import emu_build
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redrafter_ext import reference as ref

SANITIZE = os.environ.get("REDRAFTER_EMU_SANITIZE") == "1"
SEEDS = (7,) if SANITIZE else (1, 2, 3)  # one schedule is enough to find memory errors
FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def emu():
    return emu_build.build(sanitize=SANITIZE)


def seeds():
    yield from SEEDS


# ------------------------------------------------------------------------------------------------
# verify_greedy (the cases both emulators run: tests/test_emulated.py)


def test_verify_greedy_arbitrary_nodes(emu):
    # beam_node need not come from build_trie: nodes shared by unrelated beams, repeated along a beam,
    # the same prefix on different nodes (the lazy walk then has several nodes per depth)
    g = gen(41)
    B, W, L, V = 3, 6, 5, 7
    N = ref.num_nodes_max(W, L)
    for _ in range(4):
        beams = torch.randint(0, 3, (B, W, L), generator=g, dtype=torch.int32)
        beam_node = torch.randint(0, 9, (B, W, L), generator=g, dtype=torch.int32)  # few nodes: sharing
        logits = torch.randint(0, 3, (B, N, V), generator=g).float()
        logits[:, :, 0] += 2  # token 0 is often the argmax: walks go deep
        exp = ref.verify_greedy(logits, beams, beam_node)
        for strategy, seed in itertools.product((1, 2), seeds()):
            emu.set_seed(seed)
            got = co.verify_greedy(emu, logits, beams, beam_node, strategy)
            for a, b in zip(got, exp):
                assert torch.equal(a, b), f"strategy {strategy}, seed {seed}\n{a}\n{b}"
    # out of range nodes count as argmax -1 (the reference cannot take them): both strategies agree
    beam_node[0, 2, 1] = N + 4
    beam_node[1, :, 0] = -3
    outs = [co.verify_greedy(emu, logits, beams, beam_node, strategy) for strategy in (1, 2)]
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    assert outs[0][0][1] == 0 and outs[0][3][1] == -1


# ------------------------------------------------------------------------------------------------
# ngram_lookup: one CTA per row (32..256 threads, the smallest power of two >= S), each thread a
# strided share of the candidate ends, one block max-reduce of run * (S + 1) + e in shared memory.
# Bit-exact against the reference and against the docstring's loops (cases.ngram_lookup_expected);
# a length outside [0, S] is clamped by the kernel (csrc/cuda/kernels.h), so it must equal the
# reference on the clamped length.


def check_lookup(emu, tokens, length, max_n, m, seeds_=SEEDS, loops=True):
    """The emulated kernel under each schedule == the reference (and the loops) on length clamped."""
    clamped = length.clamp(0, tokens.shape[1])
    exp = ref.ngram_lookup(tokens, clamped, max_n, m)
    if loops:
        assert torch.equal(exp, ngram_lookup_expected(tokens, clamped, max_n, m)), "reference != loops"
    for seed in seeds_:
        emu.set_seed(seed)
        got = co.ngram_lookup(emu, tokens, length, max_n, m)
        assert got.dtype == torch.int32 and got.shape == exp.shape
        assert torch.equal(got, exp), (f"max_n={max_n} m={m} seed {seed} {tokens.dtype}/{length.dtype} "
                                       f"length={length.tolist()}\n{got}\n{exp}")
    return exp


# S: one row shorter than a warp, around a warp, past one block of 256 threads (the strided scan and
# the reduce over every thread), and a long history
@pytest.mark.parametrize("S", [1, 2, 31, 33, 257, 300, 2048])
@pytest.mark.parametrize("B", [1, 3, 7])
@pytest.mark.parametrize("vocab", [3, 5, 32000])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ngram_lookup_sizes(emu, B, S, vocab, dtype):
    tokens, length = lookup_cases(seed=B * 10000 + S * 10 + vocab % 7, B=B, S=S, vocab=vocab, dtype=dtype)
    lengths = [length] + [torch.full((B,), n, dtype=dtype) for n in sorted({0, 1, 2, S}) if n <= S]
    found = 0
    for j, ln in enumerate(lengths):
        for max_n in (1, 2, 3, 4):
            m = (1, 2, 5, 9, 3, 7, 4, 8, 6)[(j * 4 + max_n) % 9]
            seeds_ = SEEDS if max_n == 2 or j == 0 else SEEDS[:1]
            found += int((check_lookup(emu, tokens, ln, max_n, m, seeds_)[:, 0] >= 0).sum())
    if S >= 8 and vocab <= 5:
        assert found > 0  # small alphabets: matches happen


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_ngram_lookup_out_of_range_lengths(emu, dtype):
    # the CPU op raises; the CUDA kernel (which reads no value on the host) clamps into [0, S]
    big = 2**31 - 1 if dtype == torch.int32 else 2**40
    for S in (1, 2, 33, 300):
        tokens, _ = lookup_cases(seed=S, B=8, S=S, vocab=3, dtype=dtype)
        length = torch.tensor([-1, S + 1, -5, S + 100, -big, big, S, 0], dtype=dtype)
        for max_n, m in ((1, 1), (2, 9), (4, 5)):
            check_lookup(emu, tokens, length, max_n, m)
    # a mixed-dtype pair runs in the common (wider) type, as the torch launcher passes it
    tokens, _ = lookup_cases(seed=5, B=3, S=40, vocab=3, dtype=torch.int32)
    check_lookup(emu, tokens, torch.tensor([-(2**40), 2**40, 17]), 3, 4)


def test_ngram_lookup_edges(emu):
    # the docstring's example
    tokens = torch.tensor([[4, 5, 6, 7, 4, 5, 0], [1, 2, 1, 2, 0, 0, 0]])
    got = check_lookup(emu, tokens, torch.tensor([6, 4]), 2, 3)
    assert got.tolist() == [[6, 7, 4], [1, 2, 1]]
    # constant rows: every end matches with the longest key; the latest wins, period 1
    for S in (2, 33, 300, 2048):
        for dtype in (torch.int32, torch.int64):
            t = torch.full((2, S), 7, dtype=dtype)
            t[1, :] = torch.arange(S) % 2  # period 2 all along the row
            exp = check_lookup(emu, t, torch.tensor([S, S], dtype=dtype), 4, 9)
            assert exp[0].tolist() == [7] * 9
    # no repeat at all: -1 everywhere; and a key that occurs only at the very start
    t = torch.arange(300)[None].repeat(2, 1)
    t[1, 299] = 0
    exp = check_lookup(emu, t, torch.tensor([300, 300]), 4, 5)
    assert exp[0].tolist() == [-1] * 5 and exp[1].tolist() == [1, 2, 3, 4, 5]
    # int64 ids compared at full width: 7 and 2^32 + 7 differ (the drafts are cast to int32)
    t = torch.tensor([[7, 2**32 + 7, 9, 7]])
    assert check_lookup(emu, t, torch.tensor([4]), 2, 3, loops=False).tolist() == [[7, 9, 7]]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lookup_inputs(max_b=5, max_s=70), st.integers(0, 2))
def test_ngram_lookup_hypothesis(emu, args, which):
    tokens, length, max_n, m = args
    check_lookup(emu, tokens, length, max_n, m, seeds_=SEEDS[which : which + 1])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lookup_inputs(), st.lists(st.integers(-3, 3), min_size=5, max_size=5))
def test_ngram_lookup_hypothesis_lengths_past_the_ends(emu, args, shift):
    # lengths pushed below 0 and past S: the kernel must equal the reference on the clamped length
    tokens, length, max_n, m = args
    B, S = tokens.shape
    off = torch.tensor(shift[:B], dtype=length.dtype)
    length = torch.where(length == 0, off.clamp(max=0), torch.where(length == S, S + off.clamp(min=0), length))
    check_lookup(emu, tokens, length, max_n, m)


# ------------------------------------------------------------------------------------------------
# negative controls: the shim must catch these bugs


# (the missing barrier and the divergent ones: tests/test_emulated.py)


# ------------------------------------------------------------------------------------------------
# the same tests under ASan + UBSan (a subprocess: libasan must be preloaded into Python)


@pytest.mark.skipif(SANITIZE, reason="already the sanitized run")
def test_sanitized():
    def lib(name):
        return subprocess.run([emu_build.CXX, f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()

    asan, stdcxx = lib("libasan.so"), lib("libstdc++.so")
    if not os.path.isabs(asan):
        pytest.skip("no libasan for g++ here")
    # libstdc++ preloaded too: python does not link it, and ASan's __cxa_throw interceptor needs it
    env = dict(os.environ, REDRAFTER_EMU_SANITIZE="1", LD_PRELOAD=f"{asan} {stdcxx}",
               ASAN_OPTIONS="detect_leaks=0:detect_stack_use_after_return=0", UBSAN_OPTIONS="print_stacktrace=1")
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__,
         str(Path(__file__).with_name("test_emulated.py")), "-k", "not sanitized and not big and not metal"],
        env=env, capture_output=True, text=True, cwd=Path(__file__).parent.parent,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]


# ------------------------------------------------------------------------------------------------
# verify_sample. The kernel's sums are block reductions, not the reference's index-order
# sequential sums, so its float64 probabilities and masses differ from the reference's in the last
# bits: integer outputs are compared on rows whose every decision (each u * mass vs p[t], the final
# u * total vs the prefix sums, each visited node's top-p boundary) is at least MARGIN (relative)
# away from its threshold, measured on the reference's own numbers; such rows are all but every row.

MARGIN = 1e-9


def run_sample(emu, logits, beams, beam_node, au, su, t, k, p, seed):
    emu.set_seed(seed)
    return co.verify_sample(emu, logits, beams, beam_node, au, su, t, k, p)


def _top_p_margin(q: torch.Tensor, top_p: float) -> float:
    """Distance of the reference's top-p decisions from top_p at one node (inf when top-p is off)."""
    if top_p >= 1.0 or torch.isnan(q).any():
        return float("inf")
    sp = torch.sort(q, descending=True, stable=True).values
    excl = torch.cat([sp.new_zeros(1), sp.cumsum(0)[:-1]])
    # keeping or dropping a token of mass < 1e-12 moves the other decisions by < 1e-12 (relative),
    # well inside their own MARGIN: only heavier tokens' boundary decisions count
    d = torch.where(sp < 1e-12, float("inf"), (excl - top_p).abs())
    return float(d.min())


def sample_margins(logits, beams, beam_node, au, su, t, k, p) -> torch.Tensor:
    """(B,) smallest relative distance of any decision of the reference's walk from its threshold."""
    B, W, L = beams.shape
    probs = ref.sampling_probs(logits, t, k, 1.0)
    probs_p = ref.sampling_probs(logits, t, k, p)
    bn, tok = beam_node.long(), beams.long()
    out = torch.full((B,), float("inf"), dtype=torch.float64)
    for b in range(B):
        cur, margin = int(bn[b, 0, 0]), float("inf")
        margin = min(margin, _top_p_margin(probs[b, cur], p))
        q = probs_p[b, cur].clone()
        for d in range(L - 1):
            child, seen, rank = None, set(), 0
            for w in range(W):
                if int(bn[b, w, d]) != cur or int(bn[b, w, d + 1]) in seen:
                    continue
                seen.add(int(bn[b, w, d + 1]))
                tt = int(tok[b, w, d + 1])
                mass = float(q.cumsum(0)[-1])
                u = float(au[b, d, rank])
                rank += 1
                if q[tt] > 0:  # p(t) == 0 rejects exactly, whatever the rounding
                    margin = min(margin, abs(u * mass - float(q[tt])) / mass)
                if u * mass < float(q[tt]):
                    child = int(bn[b, w, d + 1])
                    break
                q[tt] = 0.0
            if child is None:
                break
            cur = child
            margin = min(margin, _top_p_margin(probs[b, cur], p))
            q = probs_p[b, cur].clone()
        c = q.cumsum(0)
        if c[-1] > 0:
            margin = min(margin, float((c - float(su[b]) * c[-1]).abs().min() / c[-1]))
        out[b] = margin
    return out


def check_sample(emu, logits, beams, beam_node, au, su, t, k, p, seeds_=SEEDS):
    exp = ref.verify_sample(logits, beams, beam_node, au, su, t, k, p)
    safe = sample_margins(logits, beams, beam_node, au, su, t, k, p) >= MARGIN if t > 0 else torch.ones(len(su), dtype=torch.bool)
    assert safe.float().mean() >= 0.5, "test data too close to the decision thresholds"
    for seed in seeds_:
        got = run_sample(emu, logits, beams, beam_node, au, su, t, k, p, seed)
        for name, a, e in zip(("accept_len", "best_beam", "path_nodes", "next_token"), got, exp, strict=True):
            assert torch.equal(a[safe], e[safe]), f"{name} (T={t} top_k={k} top_p={p}, seed {seed})\n{a}\n{e}"
        # every row: a consistent walk and a sampled token of positive weight at its stop node
        acc, best, path, nxt = got
        for b in range(len(su)):
            a_ = int(acc[b])
            assert path[b, : a_ + 1].tolist() == beam_node[b, int(best[b]), : a_ + 1].tolist()
        if t > 0:
            q = ref.sampling_probs(logits, t, k, p)
            last = path.gather(1, acc.long()[:, None])[:, 0].long()
            assert (q[torch.arange(len(su)), last, nxt.long()] > 0).all()
    return exp


def sample_case(B, W, L, V, seed, dtype=torch.float32, n_tokens=3, boost=1.5, idx=torch.int64):
    g = gen(seed)
    beams = torch.randint(0, n_tokens, (B, W, L), generator=g)
    beams[:, :, 0] = beams[:, :1, 0]
    _, _, _, beam_node, _ = ref.build_trie(beams)
    logits = torch.randn(B, ref.num_nodes_max(W, L), V, generator=g) * 2
    logits[:, :, :n_tokens] += boost  # drafts are likely enough to be accepted often
    au = torch.rand(B, L - 1, W, generator=g)
    su = torch.rand(B, generator=g)
    return logits.to(dtype), beams.to(idx), beam_node.to(idx), au, su


SETTINGS_SAMPLE = [(1.0, 0, 1.0), (0.5, 3, 1.0), (2.0, 0, 0.9), (1.0, 1, 1.0), (1.0, 0, 0.05), (0.7, 111, 0.8),
                   (1.3, 20, 0.9), (0.0, 0, 1.0)]


@pytest.mark.parametrize("B,W,L", [(1, 1, 1), (3, 1, 2), (7, 2, 3), (3, 4, 5), (1, 8, 4), (7, 3, 1), (3, 5, 8)])
@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_sample(emu, B, W, L, dtype):
    accepted = 0
    for j, (t, k, p) in enumerate(SETTINGS_SAMPLE):
        idx = (torch.int32, torch.int64)[j % 2]
        args = sample_case(B, W, L, 111, seed=B * 100 + W * 10 + L + j, dtype=dtype, idx=idx)
        accepted += int(check_sample(emu, *args, t, k, p)[0].sum())
    if L > 1:
        assert accepted > 0


@pytest.mark.parametrize("V,dtype,B", [(32000, torch.float16, 3), (128256, torch.bfloat16, 1),
                                       (32000, torch.float32, 1)])
def test_verify_sample_big_vocab(emu, V, dtype, B):
    args = sample_case(B, 3, 4, V, seed=V, dtype=dtype, boost=9.0)
    for t, k, p in [(1.0, 0, 1.0), (0.5, 50, 0.9), (2.0, 0, 0.3)]:
        check_sample(emu, *args, t, k, p, seeds_=SEEDS[:1])


@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_sample_ties(emu, dtype):
    # integer logits: exact ties at the top-k threshold and across the top-p boundary
    B, W, L, V = 3, 3, 4, 40
    logits, beams, beam_node, au, su = sample_case(B, W, L, V, seed=12, dtype=dtype)
    logits = torch.randint(0, 3, logits.shape, generator=gen(13)).to(dtype)
    logits[1] = 0.0  # uniform rows: every token tied
    for t, k, p in [(1.0, 5, 1.0), (1.0, 0, 0.5), (1.0, 7, 0.61), (1.0, 0, 0.3), (0.5, 39, 0.97)]:
        check_sample(emu, logits, beams, beam_node, au, su, t, k, p)


def test_verify_sample_top_p_boundaries(emu):
    # the top-p boundary search on awkward distributions: integer logits (ties everywhere), huge
    # scales (most p underflow to 0 or are subnormal), near-uniform rows, top_p near 0 and near 1
    g = gen(77)
    for case in range(36):
        V = int(torch.randint(2, 400, (), generator=g))
        logits, beams, beam_node, au, su = sample_case(3, 2, 3, V, seed=1000 + case)
        kind = case % 4
        if kind == 0:
            logits = torch.randint(-2, 3, logits.shape, generator=g).float()
        elif kind == 1:
            logits = logits * 300.0
        elif kind == 2:
            logits = 1.0 + torch.randn(logits.shape, generator=g) * 1e-6
        top_p = [1e-6, 0.3, 0.5, 0.9, 0.999, 1 - 1e-12][case % 6]
        top_k = [0, 0, 3, V - 1][(case // 6) % 4]
        check_sample(emu, logits, beams, beam_node, au, su, 1.0, top_k, top_p, seeds_=SEEDS[case % 3 : case % 3 + 1])


@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_sample_nonfinite(emu, dtype):
    # NaN / +-inf logits make every p of the node NaN (or the top-k threshold NaN): every comparison
    # is then false whatever the rounding, so all rows must equal the reference exactly
    logits, beams, beam_node, au, su = sample_case(4, 3, 4, 50, seed=3)
    logits[0, :, 7] = float("nan")
    logits[1, :, :] = float("-inf")
    logits[2, :, 5] = float("inf")
    logits[3, 0, 1] = float("nan")
    logits = logits.to(dtype)
    for t, k, p in [(1.0, 0, 1.0), (1.0, 5, 1.0), (1.0, 0, 0.9), (1.0, 60, 0.5), (1.0, 1, 1.0)]:
        exp = ref.verify_sample(logits, beams, beam_node, au, su, t, k, p)
        for seed in SEEDS:
            got = run_sample(emu, logits, beams, beam_node, au, su, t, k, p, seed)
            for a, e in zip(got, exp, strict=True):
                assert torch.equal(a, e), f"T={t} top_k={k} top_p={p} seed {seed}\n{a}\n{e}"


def test_verify_sample_guards(emu):
    # out-of-range values (the CPU op raises; the CUDA kernel must stay in bounds and say what it did)
    B, W, L, V = 3, 2, 3, 17
    logits, beams, beam_node, au, su = sample_case(B, W, L, V, seed=21)
    logits = logits.clone()
    logits[:, :, 1] = 30.0  # token 1 is (almost) certain: drafts of token 1 are accepted
    beams = beams.clone()
    beams[:, :, 1:] = 1
    beam_node = beam_node.clone()
    beams[0, 0, 1] = V + 5  # row 0: beam 0's draft token is outside the vocabulary: rejected
    beam_node[1, :, 0] = 99  # row 1: the root is outside the logits: stop at once, next token -1
    au = au.clone()
    au[2] = float("nan")  # row 2: NaN uniforms reject
    su = su.clone()
    su[2] = float("nan")
    for seed in SEEDS:
        acc, best, path, nxt = run_sample(emu, logits, beams, beam_node, au, su, 1.0, 0, 1.0, seed)
        assert int(acc[1]) == 0 and int(nxt[1]) == -1 and path[1].tolist() == [99, -1, -1]
        assert int(acc[2]) == 0 and 0 <= int(nxt[2]) < V
        assert int(best[0]) in (0, 1) and 0 <= int(nxt[0]) < V
        assert not (int(acc[0]) > 0 and int(best[0]) == 0)  # never walks into the bad token


@pytest.mark.skipif(SANITIZE, reason="memory errors are the other tests' job; this one is slow under ASan")
def test_verify_sample_statistical(emu):
    # the exactness harness of test_sampling.py with the emulated kernel: one tree, 6k trials (the
    # emulator runs ~1k rows/s)
    import test_sampling as ts

    def verify(logits, beams, beam_node, au, su, t, k, p):
        return run_sample(emu, logits.contiguous(), beams, beam_node.to(beams.dtype), au, su, t, k, p, seed=5)

    stat, dof, pval, mean_acc = ts.run_trials(4, 4, "good", 1.0, 0, 1.0, seed=31, verify=verify, B=6_000)
    print(f"emulated W4-L4-good-T1: chi2={stat:.1f} dof={dof} p={pval:.3f} mean accept {mean_acc:.2f}")
    assert pval > 0.01 and mean_acc > 1.0
