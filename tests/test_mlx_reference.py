"""The pure-MLX reference ops (``redrafter_ext.mlx.reference``) against the PyTorch reference.

Integer outputs must be identical, float outputs equal to float32 rounding; awkward sizes (batch
1/3/7, W and L from 1), ties, -inf/NaN scores, int32/int64 inputs and every float dtype.
Trie and mask properties are checked with hypothesis on the MLX outputs themselves.
"""

from __future__ import annotations

import math

import pytest

mx = pytest.importorskip("mlx.core")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cases import lookup_cases, lookup_inputs, ngram_lookup_expected, token_beams  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from redrafter_ext import reference as ref  # noqa: E402
from redrafter_ext.mlx import reference as mref  # noqa: E402

TORCH_OF = {mx.float32: torch.float32, mx.float16: torch.float16, mx.bfloat16: torch.bfloat16}
MX_OF = {v: k for k, v in TORCH_OF.items()}
MX_OF.update({torch.int32: mx.int32, torch.int64: mx.int64, torch.bool: mx.bool_})
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def to_mx(t: torch.Tensor) -> mx.array:
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: go through float32 (exact)
        return mx.array(t.float().numpy()).astype(mx.bfloat16)
    if t.dtype == torch.float64:  # mx.array(float64 numpy) would round to float32
        return mx.array(t.numpy(), dtype=mx.float64)
    return mx.array(t.numpy())


def to_torch(a: mx.array) -> torch.Tensor:
    if a.dtype == mx.bfloat16:
        return torch.from_numpy(np.array(a.astype(mx.float32))).to(torch.bfloat16)
    return torch.from_numpy(np.array(a))


def assert_same(want: torch.Tensor, got: mx.array, name: str, atol: float = 0.0) -> None:
    g = to_torch(got)
    assert tuple(g.shape) == tuple(want.shape), f"{name}: shape {tuple(g.shape)} != {tuple(want.shape)}"
    if want.dtype.is_floating_point:
        assert g.dtype == want.dtype, f"{name}: dtype {g.dtype} != {want.dtype}"
        torch.testing.assert_close(g, want, atol=atol, rtol=atol, equal_nan=True, msg=name)
    else:
        assert g.dtype == want.dtype, f"{name}: dtype {g.dtype} != {want.dtype}"
        assert torch.equal(g, want), f"{name}: {g} != {want}"


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_beams(B, W, L, alphabet, seed, dtype=torch.int64):
    beams = torch.randint(0, alphabet, (B, W, L), generator=gen(seed), dtype=dtype)
    beams[:, :, 0] = beams[:, :1, 0]
    return beams


# ------------------------------------------------------------------------------------------------
# beam_topk


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,W,V,L,step", [(1, 1, 1, 2, 1), (3, 4, 1, 3, 2), (7, 2, 5, 4, 3), (3, 4, 37, 5, 1),
                                          (1, 3, 300, 2, 1), (3, 5, 2, 6, 4)])
def test_beam_topk_matches_torch(dtype, B, W, V, L, step):
    g = gen(B * 100 + W * 10 + V)
    logits = (torch.randn(B, W, V, generator=g) * 3).to(dtype)
    scores = torch.randn(B, W, generator=g)
    scores[0, -1] = -math.inf
    if step == 1:
        scores = torch.full((B, W), -math.inf)
        scores[:, 0] = 0.0
    tokens = torch.randint(0, max(V, 2), (B, W, L), generator=g, dtype=torch.int64)
    state = torch.randn(B, W, 3, generator=g).to(dtype)
    want = ref.beam_topk(logits, scores, tokens, state, step)
    got = mref.beam_topk(to_mx(logits), to_mx(scores), to_mx(tokens), to_mx(state), step)
    for name, w, a, tol in zip(("scores", "tokens", "state", "parent"), want, got, (1e-5, 0, 0, 0)):
        assert_same(w, a, name, atol=tol)


@pytest.mark.parametrize("W", [1, 2, 4])
def test_beam_topk_ties_go_to_the_lower_flat_index(W):
    # identical rows and equal scores: every candidate value appears W times (and twice within a
    # row), so the order is decided by the tie rule alone
    B, V, L = 3, 6, 3
    row = torch.tensor([1.0, 3.0, 3.0, 0.0, 2.0, 3.0])
    logits = row.expand(B, W, V).clone()
    scores = torch.zeros(B, W)
    tokens = torch.arange(B * W * L, dtype=torch.int32).reshape(B, W, L)
    state = torch.arange(B * W * 2, dtype=torch.float32).reshape(B, W, 2)
    want = ref.beam_topk(logits, scores, tokens, state, 1)
    got = mref.beam_topk(to_mx(logits), to_mx(scores), to_mx(tokens), to_mx(state), 1)
    for name, w, a in zip(("scores", "tokens", "state", "parent"), want, got):
        assert_same(w, a, name)
    assert to_torch(got[3])[0].tolist() == [0] * min(W, 3) + [1] * max(0, W - 3)


def test_beam_topk_nan_rows_order_like_torch():
    logits = torch.randn(2, 3, 4, generator=gen(5))
    logits[0, 1, 2] = math.nan  # beam 1 of row 0 is all NaN after log-softmax: sorted first
    scores = torch.zeros(2, 3)
    tokens = torch.zeros(2, 3, 3, dtype=torch.int32)
    state = torch.zeros(2, 3, 1)
    want = ref.beam_topk(logits, scores, tokens, state, 1)
    got = mref.beam_topk(to_mx(logits), to_mx(scores), to_mx(tokens), to_mx(state), 1)
    for name, w, a in zip(("scores", "tokens", "state", "parent"), want, got):
        assert_same(w, a, name)


# ------------------------------------------------------------------------------------------------
# build_trie and tree_mask


# B in 1, 2, 3, 7; int32 or int64 ids
MLX_BATCH = st.sampled_from([1, 2, 3, 7])
MLX_IDS = (torch.int32, torch.int64)


@settings(max_examples=60, deadline=None)
@given(token_beams(MLX_BATCH, max_w=6, max_l=7, dtypes=MLX_IDS))
def test_build_trie_matches_torch_and_properties(beams):
    B, W, L = beams.shape
    N = 1 + W * (L - 1)
    want = ref.build_trie(beams)
    got = mref.build_trie(to_mx(beams))
    for name, w, a in zip(("node_token", "node_parent", "node_depth", "beam_node", "num_nodes"), want, got):
        assert_same(w, a, name)
    tok, par, dep, bnode, nn = (to_torch(a) for a in got)
    assert tok.shape == (B, N)
    for b in range(B):
        n = int(nn[b])
        prefixes = {tuple(beams[b, w, 1 : d + 1].tolist()) for w in range(W) for d in range(L)}
        assert n == len(prefixes)
        assert int(par[b, 0]) == -1 and int(dep[b, 0]) == 0 and int(tok[b, 0]) == int(beams[b, 0, 0])
        for i in range(1, n):
            p = int(par[b, i])
            assert 0 <= p < i and int(dep[b, i]) == int(dep[b, p]) + 1  # topological, depths
        for w in range(W):
            for d in range(L):
                node = int(bnode[b, w, d])
                assert int(tok[b, node]) == int(beams[b, w, d]) and int(dep[b, node]) == d
        assert (tok[b, n:] == 0).all() and (par[b, n:] == -1).all() and (dep[b, n:] == 0).all()


@settings(max_examples=60, deadline=None)
@given(token_beams(MLX_BATCH, max_w=8, max_l=7, dtypes=MLX_IDS))
def test_tree_mask_matches_torch_and_properties(beams):
    _, par, _, _, nn = ref.build_trie(beams)
    B, N = par.shape
    mask = mref.tree_mask(to_mx(par), to_mx(nn))
    words = mref.tree_mask(to_mx(par), to_mx(nn), packed=True)
    assert_same(ref.tree_mask(par, nn), mask, "mask")
    assert_same(ref.tree_mask(par, nn, packed=True), words, "packed")
    m, w = to_torch(mask), to_torch(words)
    assert w.shape == (B, N, math.ceil(N / 32))
    for b in range(B):
        n = int(nn[b])
        for i in range(N):
            anc, j = set(), i
            if i < n:
                while j >= 0:
                    anc.add(j)
                    j = int(par[b, j])
            else:
                anc = {i}  # padding sees only itself
            assert {j for j in range(N) if m[b, i, j]} == anc
            unpacked = {j for j in range(N) if (int(w[b, i, j // 32]) >> (j % 32)) & 1}
            assert unpacked == anc


def test_tree_mask_sign_bit_and_several_words():
    # a chain of 40 nodes: node i sees 0..i, so word 0 of rows >= 31 has bit 31 set (negative int32)
    N = 40
    par = torch.arange(-1, N - 1, dtype=torch.int32)[None].expand(3, N).clone()
    nn = torch.tensor([N, 33, 1], dtype=torch.int32)
    assert_same(ref.tree_mask(par, nn, packed=True), mref.tree_mask(to_mx(par), to_mx(nn), packed=True), "packed")
    assert_same(ref.tree_mask(par, nn), mref.tree_mask(to_mx(par), to_mx(nn)), "mask")


# ------------------------------------------------------------------------------------------------
# ngram_lookup


@settings(max_examples=60, deadline=None)
@given(lookup_inputs(max_b=7))
def test_ngram_lookup_matches_torch(args):
    tokens, length, max_n, m = args
    want = ref.ngram_lookup(tokens, length, max_n, m)
    assert torch.equal(want, ngram_lookup_expected(tokens, length, max_n, m))
    assert_same(want, mref.ngram_lookup(to_mx(tokens), to_mx(length), max_n, m), "drafts")


@pytest.mark.parametrize("B,S,vocab,dtype", [(1, 1, 3, torch.int32), (3, 2, 3, torch.int64), (7, 33, 3, torch.int32),
                                             (3, 300, 3, torch.int64), (1, 2048, 32000, torch.int64),
                                             (7, 300, 32000, torch.int32)])
def test_ngram_lookup_sizes_match_torch(B, S, vocab, dtype):
    for max_n, m in [(1, 1), (2, 9), (3, 4), (4, 7)]:
        tokens, length = lookup_cases(B * S + max_n, B, S, vocab, dtype)
        want = ref.ngram_lookup(tokens, length, max_n, m)
        assert_same(want, mref.ngram_lookup(to_mx(tokens), to_mx(length), max_n, m), f"max_n={max_n} m={m}")


def test_ngram_lookup_clamps_lengths():
    tokens, _ = lookup_cases(3, 3, 20, 3, torch.int64)
    bad = torch.tensor([-4, 21, 10**9])
    want = ref.ngram_lookup(tokens, bad.clamp(0, 20), 3, 5)
    assert_same(want, mref.ngram_lookup(to_mx(tokens), to_mx(bad), 3, 5), "drafts")


# ------------------------------------------------------------------------------------------------
# verify_greedy / verify_sample


def verify_inputs(B, W, L, V, seed, dtype=torch.float32, agree=0.7):
    """Beams that often follow the argmax of small-integer logits (long acceptances and ties)."""
    g = gen(seed)
    beams = random_beams(B, W, L, min(V, 3), seed)
    _, _, _, bnode, _ = ref.build_trie(beams)
    N = ref.num_nodes_max(W, L)
    logits = torch.randint(-3, 3, (B, N, V), generator=g).float()
    # push the draft token to the argmax at its parent with probability `agree`
    for d in range(1, L):
        par = bnode[:, :, d - 1]
        push = torch.rand(B, W, generator=g) < agree
        idx = par[:, :, None].long().expand(B, W, 1)
        tokv = beams[:, :, d : d + 1].long()
        cur = torch.gather(logits, 1, idx.expand(B, W, V))
        cur = cur.scatter(2, tokv, torch.where(push[:, :, None], 10.0, cur.gather(2, tokv)))
        logits.scatter_(1, idx.expand(B, W, V), cur)
    return logits.to(dtype), beams, bnode


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,W,L,V", [(1, 1, 1, 1), (3, 1, 4, 5), (7, 4, 4, 7), (3, 3, 1, 4), (1, 5, 6, 3)])
def test_verify_greedy_matches_torch(dtype, B, W, L, V):
    for seed in range(3):
        logits, beams, bnode = verify_inputs(B, W, L, V, seed, dtype)
        want = ref.verify_greedy(logits, beams, bnode)
        got = mref.verify_greedy(to_mx(logits), to_mx(beams.int()), to_mx(bnode))
        for name, w, a in zip(("accept_len", "best_beam", "path_nodes", "next_token"), want, got):
            assert_same(w, a, name)


@pytest.mark.parametrize("T,top_k,top_p", [(1.0, 0, 1.0), (0.5, 3, 1.0), (2.0, 0, 0.8), (1.0, 2, 0.6), (0.0, 0, 1.0)])
@pytest.mark.parametrize("B,W,L,V", [(1, 1, 2, 1), (3, 2, 3, 5), (7, 4, 4, 6), (3, 3, 1, 9)])
def test_verify_sample_matches_torch(T, top_k, top_p, B, W, L, V):
    for seed in range(3):
        logits, beams, bnode = verify_inputs(B, W, L, V, seed, agree=0.5)
        logits = logits * 0.3 + torch.randn(logits.shape, generator=gen(seed + 9))
        g = gen(seed + 1)
        au, su = torch.rand(B, L - 1, W, generator=g), torch.rand(B, generator=g)
        want = ref.verify_sample(logits, beams, bnode, au, su, T, top_k, top_p)
        got = mref.verify_sample(to_mx(logits), to_mx(beams), to_mx(bnode), to_mx(au), to_mx(su), T, top_k, top_p)
        for name, w, a in zip(("accept_len", "best_beam", "path_nodes", "next_token"), want, got):
            assert_same(w, a, name)


def test_sampling_probs_matches_torch_in_float64():
    logits = torch.randn(3, 5, 50, generator=gen(3)) * 4
    for T, k, p in [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.3, 0, 0.9), (1.0, 49, 0.5)]:
        want = ref.sampling_probs(logits, T, k, p)
        got = to_torch(mref.sampling_probs(to_mx(logits), T, k, p))
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, atol=1e-15, rtol=1e-13)
        assert torch.equal(got > 0, want > 0)  # the same tokens are kept


def test_verify_sample_follows_target_distribution():
    """The chi-square exactness test of tests/test_sampling.py, run with the MLX op (a few cases)."""
    import test_sampling as ts  # tests/ is on sys.path (conftest.py)

    def mlx_verify(logits, beams, beam_node, au, su, T, k, p):
        out = mref.verify_sample(to_mx(logits), to_mx(beams), to_mx(beam_node), to_mx(au), to_mx(su), T, k, p)
        return tuple(to_torch(a) for a in out)

    for case in [(2, 3, "good", 1.0, 0, 1.0), (2, 3, "random", 2.0, 3, 0.9), (4, 3, "bad", 1.0, 0, 0.7)]:
        W, L, drafter, T, k, p = case
        stat, dof, pval, _ = ts.run_trials(W, L, drafter, T, k, p, seed=11, verify=mlx_verify, B=20_000)
        assert pval > 0.001, f"{case}: chi2={stat:.1f} dof={dof} p={pval:.2e}"


# ------------------------------------------------------------------------------------------------
# kv_compact


def kv_inputs(B, L, S, seed, dtype):
    g = gen(seed)
    n_layers, H, D = 2, 3, 5
    kv = torch.randn(n_layers, 2, B, H, S, D, generator=g).to(dtype)
    N = 1 + 3 * (L - 1)
    acc = torch.randint(-1, L, (B,), generator=g)
    path = torch.full((B, L), -1, dtype=torch.int64)
    for b in range(B):
        nodes = sorted(torch.randperm(N - 1, generator=g)[: L - 1].add(1).tolist())
        full = [0] + nodes  # strictly increasing, so path[i] >= i
        for i in range(int(acc[b]) + 1):
            path[b, i] = full[i]
    # cache lengths from 0 up to the last that still fits the path (the window shift near the end)
    hi = S - 1 - path.amax(dim=1).clamp(min=0)
    cache_len = (torch.rand(B, generator=g) * (hi + 1)).long().clamp(max=hi).int()
    cache_len[0] = hi[0]
    return kv, cache_len, path, acc


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("B,L,S", [(1, 1, 1), (3, 4, 12), (7, 3, 8), (3, 6, 40)])
def test_kv_compact_matches_torch(dtype, B, L, S):
    for seed in range(3):
        kv, cache_len, path, acc = kv_inputs(B, L, S, seed, dtype)
        if B == 1 and L == 1:
            acc = torch.zeros(1, dtype=torch.int64)
            path = torch.zeros(1, 1, dtype=torch.int64)
            cache_len = torch.zeros(1, dtype=torch.int32)
        got_kv, got_len = mref.kv_compact(to_mx(kv), to_mx(cache_len), to_mx(path.int()), to_mx(acc))
        ref.kv_compact(kv, cache_len, path, acc)  # in place
        assert_same(kv, got_kv, "kv")
        assert_same(cache_len, got_len, "cache_len")


# ------------------------------------------------------------------------------------------------
# argument checks


def test_bad_arguments_name_the_argument():
    beams = mx.zeros((1, 2, 3), dtype=mx.int32)
    with pytest.raises(TypeError, match="beams"):
        mref.build_trie(beams.astype(mx.float32))
    with pytest.raises(ValueError, match="num_nodes"):
        mref.tree_mask(mx.zeros((2, 5), dtype=mx.int32), mx.zeros((3,), dtype=mx.int32))
    with pytest.raises(ValueError, match="step"):
        mref.beam_topk(mx.zeros((1, 2, 4)), mx.zeros((1, 2)), beams, mx.zeros((1, 2, 1)), 3)
    with pytest.raises(ValueError, match="logits must cover"):
        mref.verify_greedy(mx.zeros((1, 4, 4)), beams, beams)
    with pytest.raises(ValueError, match="accept_u"):
        mref.verify_sample(mx.zeros((1, 5, 4)), beams, beams, mx.zeros((1, 1, 2)), mx.zeros((1,)), 1.0)
    with pytest.raises(TypeError, match="cache_len"):
        mref.kv_compact(mx.zeros((1, 2, 1, 1, 4, 1)), mx.zeros((1,), dtype=mx.int64), beams[0, :1], mx.zeros((1,)).astype(mx.int32))
    with pytest.raises(ValueError, match="ngram_lookup: length must have shape"):
        mref.ngram_lookup(mx.zeros((2, 4), dtype=mx.int32), mx.zeros((3,), dtype=mx.int32), 2, 3)
    with pytest.raises(ValueError, match="ngram_lookup: max_n"):
        mref.ngram_lookup(mx.zeros((2, 4), dtype=mx.int32), mx.zeros((2,), dtype=mx.int32), 0, 3)
    with pytest.raises(TypeError, match="kv"):
        mref.kv_compact(np.zeros((1, 2, 1, 1, 4, 1)), mx.zeros((1,), dtype=mx.int32), beams[0, :1], mx.zeros((1,), dtype=mx.int32))
