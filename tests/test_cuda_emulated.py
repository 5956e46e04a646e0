"""The CUDA kernels (csrc/cuda/*.cu) run on the CPU through the host shim (tests/shim) and compared
with ``redrafter_ext.reference``: integers exactly, float scores within a per-dtype tolerance.

Each kernel runs under several schedule seeds: the seed drives the order in which the emulated
threads of a block run between synchronisation points and the garbage that fills shared memory
before each block, so a missing barrier shows up as a wrong result (see the negative controls).
The module is built with g++ by tests/emu/emu_build.py (cached under tests/.emu_build). Setting
REDRAFTER_EMU_SANITIZE=1 loads the ASan+UBSan build instead (test_sanitized runs this file so).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from cases import beam_inputs, gen, greedy_logits, kv_inputs

from redrafter_ext import reference as ref

sys.path.insert(0, str(Path(__file__).parent / "emu"))
import emu_build  # noqa: E402

SANITIZE = os.environ.get("REDRAFTER_EMU_SANITIZE") == "1"
SEEDS = (7,) if SANITIZE else (1, 2, 3)  # one schedule is enough to find memory errors
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
KIND16 = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@pytest.fixture(scope="module")
def emu():
    return emu_build.build(sanitize=SANITIZE)


def np_of(t: torch.Tensor) -> np.ndarray:
    """numpy view of a CPU tensor; 16-bit floats as their uint16 bits."""
    t = t.contiguous()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def i32(*shape) -> np.ndarray:
    return np.full(shape, -12345, dtype=np.int32)  # poison: every element must be written


def seeds():
    yield from SEEDS


# ------------------------------------------------------------------------------------------------
# tree_mask and build_trie


def run_build_trie(emu, beams: torch.Tensor, seed: int):
    B, W, L = beams.shape
    N = ref.num_nodes_max(W, L)
    out = (i32(B, N), i32(B, N), i32(B, N), i32(B, W, L), i32(B))
    emu.set_seed(seed)
    emu.build_trie(np_of(beams), *out)
    return [torch.from_numpy(o) for o in out]


def run_tree_mask(emu, parent: torch.Tensor, n: torch.Tensor, packed: bool, seed: int):
    B, N = parent.shape
    out = i32(B, N, (N + 31) // 32) if packed else np.ones((B, N, N), dtype=np.bool_)
    emu.set_seed(seed)
    emu.tree_mask(np_of(parent.to(torch.int32)), np_of(n.to(torch.int32)), packed, out)
    return torch.from_numpy(out)


def check_trie(emu, beams):
    exp = ref.build_trie(beams)
    for seed in seeds():
        got = run_build_trie(emu, beams, seed)
        for k, (a, b) in enumerate(zip(got, exp)):
            assert torch.equal(a, b), f"build_trie output {k} (seed {seed})\n{a}\n{b}"
        parent, n = exp[1], exp[4]
        for packed in (False, True):
            assert torch.equal(run_tree_mask(emu, parent, n, packed, seed), ref.tree_mask(parent, n, packed))


@pytest.mark.parametrize("B,W,L", list(itertools.product((1, 3, 7), (1, 2, 8, 64), (2, 5, 16))))
def test_build_trie_and_tree_mask(emu, B, W, L):
    g = gen(B * 1000 + W * 10 + L)
    check_trie(emu, torch.randint(0, 3, (B, W, L), generator=g, dtype=torch.int32))  # heavy sharing
    if W * L <= 128:
        check_trie(emu, torch.randint(0, 128256, (B, W, L), generator=g))  # int64, no sharing


def test_build_trie_edges(emu):
    check_trie(emu, torch.zeros(2, 3, 1, dtype=torch.int64))  # L = 1: the root only
    check_trie(emu, torch.full((1, 4, 3), 2**40 + 5))  # int64 ids compared at full width
    beams = torch.randint(0, 2, (2, 64, 17), generator=gen(3))  # W*(L-1) = 1024: several scan tiles
    check_trie(emu, beams)


def test_tree_mask_padding_and_bad_parents(emu):
    parent = torch.tensor([[-1, 0, 1, 0, 7, 2, -1], [-1, 0, 0, 2, 2, 3, 5]], dtype=torch.int32)
    n = torch.tensor([5, 7], dtype=torch.int32)
    for seed in seeds():
        for packed in (False, True):
            got = run_tree_mask(emu, parent, n, packed, seed)
            # node 4's parent 7 is not a lower index: the walk stops (the CPU op would raise)
            fixed = parent.clone()
            fixed[0, 4] = -1
            assert torch.equal(got, ref.tree_mask(fixed, n, packed))


# ------------------------------------------------------------------------------------------------
# verify_greedy


def check_verify(emu, logits, beams, beam_node):
    exp = ref.verify_greedy(logits, beams, beam_node)
    B, W, L = beams.shape
    try:
        # both strategies: the per-node argmax (1) and the lazy depth-by-depth walk (2)
        for strategy, seed in itertools.product((1, 2), seeds()):
            out = (i32(B), i32(B), i32(B, L), i32(B))
            emu.set_seed(seed)
            emu.verify_greedy_set_strategy(strategy)
            emu.verify_greedy(np_of(logits), KIND16[logits.dtype], np_of(beams), np_of(beam_node), *out)
            for k, (a, b) in enumerate(zip(out, exp)):
                assert torch.equal(torch.from_numpy(a), b), (
                    f"verify_greedy output {k} (strategy {strategy}, seed {seed})\n{a}\n{b}")
    finally:
        emu.verify_greedy_set_strategy(0)
    return exp[0]


@pytest.mark.parametrize(
    "B,W,L,V,dtype",
    [
        (1, 1, 2, 111, torch.float32),
        (3, 2, 5, 111, torch.bfloat16),
        (7, 8, 5, 111, torch.float16),
        (1, 64, 5, 111, torch.float32),
        (3, 64, 2, 111, torch.bfloat16),
        (1, 8, 16, 111, torch.float32),
        (1, 8, 5, 32000, torch.float16),
        (1, 2, 3, 128256, torch.bfloat16),
    ],
)
def test_verify_greedy(emu, B, W, L, V, dtype):
    beams = torch.randint(0, 4, (B, W, L), generator=gen(W + L))
    _, _, _, beam_node, _ = ref.build_trie(beams)
    seen = set()
    for k, follow in enumerate((0.0, 0.9)):
        logits = greedy_logits(beams, beam_node, V, follow, seed=k + V, dtype=dtype)
        idx = (torch.int32, torch.int64)[k]
        seen |= set(check_verify(emu, logits, beams.to(idx), beam_node.to(idx)).tolist())
    if L > 2 and B * W > 2:
        assert len(seen) >= 2


@pytest.mark.parametrize("dtype", FLOATS)
def test_verify_greedy_ties_nan_inf(emu, dtype):
    beams = torch.randint(0, 3, (3, 4, 4), generator=gen(8))
    _, _, _, beam_node, _ = ref.build_trie(beams)
    beam_node = beam_node.to(beams.dtype)
    logits = torch.randint(0, 2, (3, 13, 3), generator=gen(9)).to(dtype)
    check_verify(emu, logits, beams, beam_node)
    logits[1, 0, 2] = float("nan")
    logits[2, :, :] = float("-inf")
    check_verify(emu, logits, beams, beam_node)


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
        check_verify(emu, logits, beams, beam_node)
    # out of range nodes count as argmax -1 (the reference cannot take them): both strategies agree
    beam_node[0, 2, 1] = N + 4
    beam_node[1, :, 0] = -3
    outs = []
    for strategy in (1, 2):
        out = (i32(B), i32(B), i32(B, L), i32(B))
        emu.verify_greedy_set_strategy(strategy)
        emu.verify_greedy(np_of(logits), 0, np_of(beams), np_of(beam_node), *out)
        outs.append(out)
    emu.verify_greedy_set_strategy(0)
    for a, b in zip(*outs):
        assert np.array_equal(a, b)
    assert outs[0][0][1] == 0 and outs[0][3][1] == -1


# ------------------------------------------------------------------------------------------------
# kv_compact


def check_kv(emu, kv, cache_len, path, acc):
    k2, c2 = kv.clone(), cache_len.clone()
    ref.kv_compact(k2, c2, path, acc)
    for seed in seeds():
        k1, c1 = np_of(kv.clone()).copy(), np_of(cache_len.clone()).copy()
        emu.set_seed(seed)
        emu.kv_compact(k1, c1, np_of(path), np_of(acc))
        assert torch.equal(torch.from_numpy(c1), c2)
        assert np.array_equal(k1, np_of(k2)), f"seed {seed}"


@pytest.mark.parametrize("B", (1, 3, 7))
@pytest.mark.parametrize("L", (2, 5, 16))
@pytest.mark.parametrize("dtype", FLOATS)
def test_kv_compact(emu, B, L, dtype):
    for k, D in enumerate((1, 64, 3)):  # 2/4-byte slots, 16-byte vectors, odd sizes
        idx = (torch.int32, torch.int64)[k % 2]
        check_kv(emu, *kv_inputs(2, B, 3, 40, D, L, dtype, seed=k * 10 + B + L, idx=idx))


def test_kv_compact_edges(emu):
    kv, cache_len, path, acc = kv_inputs(1, 4, 2, 40, 8, 20, torch.float32, seed=1)
    acc[:] = torch.tensor([-1, 19, 0, 18])  # > 16 positions: two register chunks
    path[1] = torch.arange(20)
    path[3, :19] = torch.arange(19) + 20
    path[2, 0] = 0
    cache_len[:] = torch.tensor([40, 0, 39, 1], dtype=torch.int32)
    check_kv(emu, kv, cache_len, path, acc)
    # out-of-range rows are left untouched (the CPU op raises instead)
    kv, cache_len, path, acc = kv_inputs(1, 3, 2, 12, 4, 4, torch.float32, seed=2)
    acc[:] = torch.tensor([7, 2, 1])
    path[1, :3] = torch.tensor([0, 0, 5])  # path[1] < 1
    path[2, :2] = torch.tensor([0, 1])
    cache_len[2] = 3
    k1, c1 = np_of(kv).copy(), np_of(cache_len).copy()
    emu.kv_compact(k1, c1, np_of(path), np_of(acc))
    assert c1.tolist() == [int(cache_len[0]), int(cache_len[1]), 5]
    assert np.array_equal(k1[:, :, :2], np_of(kv)[:, :, :2])


# ------------------------------------------------------------------------------------------------
# negative controls: the shim must catch these bugs


def test_negative_missing_sync(emu):
    caught = 0
    for seed in range(8):
        out = i32(64)
        emu.set_seed(seed)
        emu.negative("missing_sync", out)
        expected = (np.arange(64)[::-1] * 7 + 1).astype(np.int32)
        caught += not np.array_equal(out, expected)
    assert caught >= 6, f"the missing barrier went unnoticed under {8 - caught} of 8 schedules"


@pytest.mark.parametrize(
    "which,pattern",
    [
        ("divergent_barrier", "different __syncthreads"),
        ("exit_before_barrier", "exited"),
        ("divergent_shuffle", "exited|deadlock"),
    ],
)
def test_negative_divergence(emu, which, pattern):
    for seed in SEEDS:
        emu.set_seed(seed)
        with pytest.raises(RuntimeError, match=pattern):
            emu.negative(which, i32(32))


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
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__, "-k", "not sanitized and not big"],
        env=env, capture_output=True, text=True, cwd=Path(__file__).parent.parent,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-6000:]


# ------------------------------------------------------------------------------------------------
# beam_topk


def run_beam_topk(emu, logits, scores, tokens, state, step, seed):
    B, W, V = logits.shape
    L, D = tokens.shape[2], state.shape[2]
    scores_out = np.full((B, W), 12345.0, dtype=np.float32)
    tokens_out, parent_out = i32(B, W, L), i32(B, W)
    state_out = torch.full((B, W, D), 777.0, dtype=state.dtype)
    state_np = np_of(state_out).copy()
    ws = np.empty(emu.beam_topk_workspace_bytes(B, W, V) + 64, dtype=np.uint8)
    off = (-ws.ctypes.data) % 16
    emu.set_seed(seed)
    emu.beam_topk(np_of(logits), KIND16[logits.dtype], np_of(scores), np_of(tokens), np_of(state), step,
                  scores_out, tokens_out, state_np, parent_out, ws[off:])
    state_t = torch.from_numpy(state_np.view(np.int16)).view(state.dtype) if state.element_size() == 2 else torch.from_numpy(state_np)
    return torch.from_numpy(scores_out), torch.from_numpy(tokens_out), state_t, torch.from_numpy(parent_out)


def check_beam_topk(emu, args, atol=1e-5, seeds_=SEEDS):
    exp = ref.beam_topk(*args)
    for seed in seeds_:
        got = run_beam_topk(emu, *args, seed=seed)
        assert torch.equal(got[3], exp[3]), f"parent (seed {seed})\n{got[3]}\n{exp[3]}"
        assert torch.equal(got[1], exp[1]), f"tokens (seed {seed})"
        assert torch.equal(got[2], exp[2]), f"state (seed {seed})"
        torch.testing.assert_close(got[0], exp[0], atol=atol, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("B,W,L,D", [(1, 1, 2, 1), (3, 2, 5, 64), (7, 8, 5, 1), (1, 64, 16, 64), (3, 64, 2, 1)])
@pytest.mark.parametrize("step", (1, "last"))
def test_beam_topk_small_vocab(emu, B, W, L, D, dtype, step):
    step = L - 1 if step == "last" else step
    check_beam_topk(emu, beam_inputs(B, W, 111, L, D, dtype, step, seed=B + W + L + step))


@pytest.mark.parametrize(
    "B,W,V,dtype",
    [(1, 8, 32000, torch.float32), (3, 2, 32000, torch.bfloat16), (1, 64, 32000, torch.float16),
     (1, 4, 128256, torch.bfloat16)],
)
def test_beam_topk_big(emu, B, W, V, dtype):
    check_beam_topk(emu, beam_inputs(B, W, V, 3, 4, dtype, 2, seed=V + W), seeds_=SEEDS[:2] if V > 100000 else SEEDS)


@pytest.mark.parametrize("dtype", FLOATS)
def test_beam_topk_ties(emu, dtype):
    # integer logits: exact ties everywhere, across splits and beams (ties to the lower flat index)
    B, W, V = 2, 8, 5000
    logits = torch.randint(0, 3, (B, W, V), generator=gen(5)).to(dtype)
    scores = torch.zeros(B, W)
    tokens = torch.zeros(B, W, 3, dtype=torch.int32)
    check_beam_topk(emu, (logits, scores, tokens, torch.randn(B, W, 2).to(dtype), 1))
    # W > V: a row contributes only V candidates
    check_beam_topk(emu, beam_inputs(2, 8, 5, 3, 2, dtype, 2, seed=6))
    # few finite logits: -inf candidates fill the top-W by index
    logits = torch.full((1, 4, 3000), float("-inf"))
    logits[0, :, 2500] = 1.0
    check_beam_topk(emu, (logits.to(dtype), torch.zeros(1, 4), tokens[:1, :4], torch.randn(1, 4, 2), 1))


def test_beam_topk_nonfinite(emu):
    B, W, V = 3, 4, 3000
    logits, scores, tokens, state, step = beam_inputs(B, W, V, 3, 2, torch.float32, 2, seed=9)
    logits[0, 1, 7] = float("nan")
    logits[1, 2, :] = float("-inf")
    logits[2, 0, 2999] = float("inf")
    scores[1, 0] = float("-inf")
    check_beam_topk(emu, (logits, scores, tokens, state, step))
    scores[2, 3] = float("inf")
    check_beam_topk(emu, (logits, scores, tokens, state, step))


def test_beam_topk_rounding_ties(emu):
    # large scores: f = s + ((x - m) - logsum) rounds different x to equal f; the reference orders
    # them by index, which can put a lower-x element (beyond the per-split slack) into the top-W
    B, W, V = 1, 4, 6000
    g = gen(11)
    logits = torch.randn(B, W, V, generator=g) * 1e-3
    scores = torch.full((B, W), 3.0e4)
    tokens = torch.zeros(B, W, 3, dtype=torch.int64)
    check_beam_topk(emu, (logits, scores, tokens, torch.randn(B, W, 1), 1))


# ------------------------------------------------------------------------------------------------
# verify_sample. The kernel's sums are block reductions, not the reference's index-order
# sequential sums, so its float64 probabilities and masses differ from the reference's in the last
# bits: integer outputs are compared on rows whose every decision (each u * mass vs p[t], the final
# u * total vs the prefix sums, each visited node's top-p boundary) is at least MARGIN (relative)
# away from its threshold, measured on the reference's own numbers; such rows are all but every row.

MARGIN = 1e-9


def run_sample(emu, logits, beams, beam_node, au, su, t, k, p, seed):
    B, W, L = beams.shape
    out = (i32(B), i32(B), i32(B, L), i32(B))
    ws = np.full(max(1, B * logits.shape[2]), np.nan)  # poison: the kernel writes before it reads
    emu.set_seed(seed)
    emu.verify_sample(np_of(logits), KIND16[logits.dtype], np_of(beams), np_of(beam_node), np_of(au), np_of(su),
                      t, k, p, *out, ws)
    return [torch.from_numpy(o) for o in out]


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
