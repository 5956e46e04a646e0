"""The reference ops against brute-force loop implementations, plus trie/mask properties."""

from __future__ import annotations

import math

import pytest
import torch
from cases import token_beams
from hypothesis import given, settings

from redrafter_ext import reference as ref


@settings(max_examples=150, deadline=None)
@given(token_beams())
def test_trie_properties(beams):
    B, W, L = beams.shape
    N = 1 + W * (L - 1)
    tok, par, dep, bnode, nn = ref.build_trie(beams)
    for t in (tok, par, dep, bnode, nn):
        assert t.dtype == torch.int32
    assert tok.shape == (B, N) and bnode.shape == (B, W, L)
    for b in range(B):
        prefixes = {tuple(beams[b, w, 1 : d + 1].tolist()) for w in range(W) for d in range(L)}
        n = int(nn[b])
        assert n == len(prefixes)  # one node per distinct prefix (the empty one is the root)
        seen = {}
        for w in range(W):
            for d in range(L):
                node = int(bnode[b, w, d])
                assert 0 <= node < n
                assert int(tok[b, node]) == int(beams[b, w, d])  # the node holds the beam's token
                assert int(dep[b, node]) == d
                key = tuple(beams[b, w, 1 : d + 1].tolist())
                assert seen.setdefault(key, node) == node  # shared prefix -> same node
                if d > 0:
                    assert int(par[b, node]) == int(bnode[b, w, d - 1])
        assert int(par[b, 0]) == -1 and int(dep[b, 0]) == 0
        for i in range(1, n):
            p = int(par[b, i])
            assert 0 <= p < i  # topological
            assert int(dep[b, i]) == int(dep[b, p]) + 1
        # node order: first occurrence, beam-major then depth
        order = []
        for w in range(W):
            for d in range(L):
                node = int(bnode[b, w, d])
                if node not in order:
                    order.append(node)
        assert order == list(range(n))
        # padding
        assert (tok[b, n:] == 0).all() and (par[b, n:] == -1).all() and (dep[b, n:] == 0).all()


@settings(max_examples=150, deadline=None)
@given(token_beams(max_w=8, max_l=6))
def test_tree_mask_properties(beams):
    _, par, _, bnode, nn = ref.build_trie(beams)
    B, N = par.shape
    mask = ref.tree_mask(par, nn)
    words = ref.tree_mask(par, nn, packed=True)
    assert mask.dtype == torch.bool and mask.shape == (B, N, N)
    assert words.dtype == torch.int32 and words.shape == (B, N, math.ceil(N / 32))
    for b in range(B):
        n = int(nn[b])
        for i in range(N):
            expect = set()
            if i < n:
                j = i
                while j >= 0:
                    expect.add(j)
                    j = int(par[b, j])
            else:
                expect = {i}  # padding sees only itself
            assert set(torch.nonzero(mask[b, i]).flatten().tolist()) == expect
            # packed and bool layouts agree bit for bit, least significant bit first
            for j in range(N):
                bit = (int(words[b, i, j // 32]) >> (j % 32)) & 1
                assert bit == int(mask[b, i, j])
    # native kernel agrees with the reference
    from redrafter_ext import ops

    assert torch.equal(ops.tree_mask(par, nn), mask)
    assert torch.equal(ops.tree_mask(par, nn, packed=True), words)


def test_tree_mask_padding_and_bit31():
    # a chain of 40 nodes crosses a word boundary and sets bit 31 (negative int32 words)
    N = 40
    par = torch.arange(-1, N - 1)[None]
    nn = torch.tensor([33])
    words = ref.tree_mask(par, nn, packed=True)
    assert int(words[0, 31, 0]) == -1  # all 32 bits set
    assert int(words[0, 32, 1]) == 1 and int(words[0, 32, 0]) == -1
    assert int(words[0, 35, 1]) == 1 << 3 and int(words[0, 35, 0]) == 0  # padding row: itself only


def brute_beam_topk(logits, scores, tokens, state, step):
    B, W, V = logits.shape
    lp = torch.log_softmax(logits.double(), -1)
    out = []
    for b in range(B):
        cands = [(float(scores[b, w]) + float(lp[b, w, v]), w * V + v) for w in range(W) for v in range(V)]
        cands.sort(key=lambda c: (-c[0], c[1]))  # descending, ties to the lower flat index
        out.append(cands[:W])
    return out


@pytest.mark.parametrize("B,W,V,L,step", [(1, 1, 7, 2, 1), (3, 4, 11, 5, 2), (2, 8, 5, 3, 1), (1, 3, 2, 4, 3)])
def test_beam_topk_matches_brute_force(B, W, V, L, step):
    g = torch.Generator().manual_seed(B * 100 + W)
    logits = torch.randn(B, W, V, generator=g)
    scores = torch.randn(B, W, generator=g)
    tokens = torch.randint(0, V, (B, W, L), generator=g, dtype=torch.int32)
    state = torch.randn(B, W, 3, generator=g)
    s, t, stt, par = ref.beam_topk(logits, scores, tokens, state, step)
    want = brute_beam_topk(logits, scores, tokens, state, step)
    for b in range(B):
        for j, (score, flat) in enumerate(want[b]):
            w, v = divmod(flat, V)
            assert int(par[b, j]) == w
            assert int(t[b, j, step]) == v
            assert torch.equal(t[b, j, :step], tokens[b, w, :step].int())
            assert torch.equal(stt[b, j], state[b, w])
            assert abs(float(s[b, j]) - score) < 1e-5


def test_beam_topk_first_step_and_ties():
    # scores [0, -inf, ...]: only beam 0 expands; equal logits tie to the lower token id
    logits = torch.zeros(1, 3, 4)
    scores = torch.tensor([[0.0, float("-inf"), float("-inf")]])
    tokens = torch.zeros(1, 3, 3, dtype=torch.int32)
    s, t, _, par = ref.beam_topk(logits, scores, tokens, torch.zeros(1, 3, 1), 1)
    assert par.tolist() == [[0, 0, 0]]
    assert t[0, :, 1].tolist() == [0, 1, 2]


def test_verify_greedy_matches_loop():
    g = torch.Generator().manual_seed(0)
    for _ in range(30):
        B, W, L, V = 2, 4, 5, 3
        beams = torch.randint(0, V, (B, W, L), generator=g)
        beams[:, :, 0] = beams[:, :1, 0]
        _, _, _, bnode, _ = ref.build_trie(beams)
        N = 1 + W * (L - 1)
        logits = torch.randn(B, N, V, generator=g)
        acc, best, path, nxt = ref.verify_greedy(logits, beams, bnode)
        am = logits.argmax(-1)
        for b in range(B):
            lens = []
            for w in range(W):
                k = 0
                while k + 1 < L and int(beams[b, w, k + 1]) == int(am[b, bnode[b, w, k]]):
                    k += 1
                lens.append(k)
            best_w = max(range(W), key=lambda w: (lens[w], -w))
            assert int(acc[b]) == lens[best_w] and int(best[b]) == best_w
            want_path = [int(bnode[b, best_w, i]) if i <= lens[best_w] else -1 for i in range(L)]
            assert path[b].tolist() == want_path
            assert int(nxt[b]) == int(am[b, want_path[lens[best_w]]])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_compact_matches_loop(dtype):
    g = torch.Generator().manual_seed(0)
    n_layers, B, H, S, D = 2, 3, 2, 20, 4
    kv = torch.randn(n_layers, 2, B, H, S, D, generator=g).to(dtype)
    cache_len = torch.tensor([3, 10, 16], dtype=torch.int32)  # the last row sits near the end
    path = torch.tensor([[0, 2, 5, -1], [0, 1, 2, 3], [0, 3, -1, -1]])
    acc = torch.tensor([2, 3, -1])  # row 2 inactive
    want = kv.clone()
    for b in range(B):
        for i in range(int(acc[b]) + 1):
            want[:, :, b, :, int(cache_len[b]) + i] = want[:, :, b, :, int(cache_len[b]) + int(path[b, i])]
    ref.kv_compact(kv, cache_len, path, acc)
    assert torch.equal(kv, want)
    assert cache_len.tolist() == [6, 14, 16]


def test_kv_compact_rejects_overflow_without_writing():
    kv = torch.randn(1, 2, 1, 1, 8, 2)
    before = kv.clone()
    cache_len = torch.tensor([6], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="cache_len"):
        ref.kv_compact(kv, cache_len, torch.tensor([[0, 3]]), torch.tensor([1]))
    assert torch.equal(kv, before) and cache_len.tolist() == [6]
