"""Input generators and comparisons shared by the op tests (native CPU, MLX, CUDA and Metal emulated).

Every generator is a function of its seed only, so a test file that uses it keeps its cases.
"""

from __future__ import annotations

import itertools

import torch
from hypothesis import strategies as st


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def assert_same(got, expected, what: str = "", label: str = "native") -> None:
    """Same number of outputs, same dtypes, equal values (integers and exact floats)."""
    for k, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.dtype == b.dtype, f"{what} output {k}: dtype {a.dtype} != {b.dtype}"
        assert torch.equal(a, b), f"{what} output {k} differs:\n{label} {a}\nreference {b}"


def beam_inputs(B, W, V, L, D, dtype, step, seed, tokens_dtype=torch.int64, state_dtype=None):
    """``beam_topk`` arguments: random logits, sorted running scores (``[0, -inf, ..]`` at step 1)."""
    g = gen(seed)
    logits = (torch.randn(B, W, V, generator=g) * 3).to(dtype)
    if step == 1:
        scores = torch.full((B, W), float("-inf"))
        scores[:, 0] = 0.0
    else:
        scores = -(torch.rand(B, W, generator=g) * 10).sort(dim=1).values
    tokens = torch.randint(0, V, (B, W, L), generator=g).to(tokens_dtype)
    state = torch.randn(B, W, D, generator=g).to(state_dtype or dtype)
    return logits, scores, tokens, state, step


def follow_tokens(g: torch.Generator, beams, beam_node, N: int, V: int, follow: float) -> torch.Tensor:
    """``(B, N)`` int64: per trie node, with probability ``follow`` the token of one of its children
    (so the beam through that child is accepted one more step), else a random token."""
    B, W, L = beams.shape
    tok = torch.empty(B, N, dtype=torch.int64)
    for b in range(B):
        children = {}
        for w, d in itertools.product(range(W), range(L - 1)):
            children.setdefault(int(beam_node[b, w, d]), []).append(int(beams[b, w, d + 1]))
        for node in range(N):
            kids = children.get(node, [])
            if kids and torch.rand((), generator=g) < follow:
                tok[b, node] = kids[int(torch.randint(0, len(kids), (), generator=g))]
            else:
                tok[b, node] = int(torch.randint(0, V, (), generator=g))
    return tok


def greedy_logits(beams, beam_node, V, follow, seed, dtype=torch.float32, extra_nodes=0):
    """Logits ``(B, 1 + W*(L-1) + extra_nodes, V)`` whose argmax at a node is ``follow_tokens``'."""
    g = gen(seed)
    B, W, L = beams.shape
    N = 1 + W * (L - 1) + extra_nodes
    logits = torch.randn(B, N, V, generator=g)
    logits.scatter_(2, follow_tokens(g, beams, beam_node, N, V, follow)[..., None], 10.0)
    return logits.to(dtype)


def kv_inputs(n_layers, B, H, S, D, L, dtype, seed, idx=torch.int64, draw_row0=True):
    """``kv_compact`` arguments: random cache, rows active or not (``accept_len = -1``), valid paths.

    Row 0, when active, ends its path at the last slot. ``draw_row0=False`` sets its length without
    drawing it first (another generator stream: the MLX tests' cases).
    """
    g = gen(seed)
    kv = torch.randn(n_layers, 2, B, H, S, D, generator=g).to(dtype)
    acc = torch.randint(-1, L, (B,), generator=g)
    path = torch.full((B, L), -1, dtype=torch.int64)
    cache_len = torch.zeros(B, dtype=torch.int32)
    for b in range(B):
        a = int(acc[b])
        # path[i] = i + extra, extra in [0, S-L]: path[i] >= i and < S, not necessarily increasing
        for i in range(a + 1):
            path[b, i] = i + int(torch.randint(0, S - L + 1, (), generator=g))
        top = int(path[b, : a + 1].max()) if a >= 0 else -1
        hi = S - 1 - top if a >= 0 else S  # an inactive row may be full
        last = b == 0 and a >= 0  # touch the last slot
        if draw_row0 or not last:
            cache_len[b] = int(torch.randint(0, hi + 1, (), generator=g))
        if last:
            cache_len[b] = hi
    return kv, cache_len, path.to(idx), acc.to(idx)


@st.composite
def shared_beams(draw, max_w=12, max_l=8):
    """Random ``(B, W, L)`` beams over a tiny alphabet (heavy prefix sharing), int32 or int64."""
    B = draw(st.integers(1, 4))
    W = draw(st.integers(1, max_w))
    L = draw(st.integers(1, max_l))
    alphabet = draw(st.integers(1, 4))  # tokens 0..alphabet-1: heavy prefix sharing
    beams = torch.randint(0, alphabet, (B, W, L), generator=gen(draw(st.integers(0, 2**31 - 1))))
    if draw(st.booleans()):  # copy whole prefixes from earlier beams as beam search does
        for b, w in itertools.product(range(B), range(1, W)):
            k = draw(st.integers(0, L))
            beams[b, w, :k] = beams[b, draw(st.integers(0, w - 1)), :k]
    return beams.to(draw(st.sampled_from([torch.int32, torch.int64])))


def trie_beams(B: int, W: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The beams of a (B, W, L) size case: shared prefixes (int32), then almost none (int64 ids)."""
    g = gen(B * 1000 + W * 10 + L)
    return torch.randint(0, 3, (B, W, L), generator=g, dtype=torch.int32), torch.randint(0, 128256, (B, W, L), generator=g)


@st.composite
def token_beams(draw, batch=None, max_w=6, max_l=6, alphabet=3, dtypes=(torch.int64,)):
    """Beams drawn token by token over a tiny alphabet (so hypothesis shrinks them), each starting
    with the guaranteed token; ``batch`` a strategy for B (default 1..3)."""
    B = draw(batch if batch is not None else st.integers(1, 3))
    W = draw(st.integers(1, max_w))
    L = draw(st.integers(1, max_l))
    toks = draw(st.lists(st.integers(0, alphabet - 1), min_size=B * W * L, max_size=B * W * L))
    beams = torch.tensor(toks, dtype=torch.int64).reshape(B, W, L)
    beams[:, :, 0] = beams[:, :1, 0]  # every beam starts with the guaranteed token
    return beams.to(draw(st.sampled_from(dtypes))) if len(dtypes) > 1 else beams


# ------------------------------------------------------------------------------------------------
# ngram_lookup


def ngram_lookup_loop(row: list[int], max_n: int, m: int) -> list[int]:
    """The lookup rule of ``reference.ngram_lookup``, written as the loops of its docstring: the
    longest key (at most ``max_n`` of the row's last tokens) that occurred earlier, its latest
    occurrence, and the ``m`` tokens after it, repeated with the match's period; -1s without one."""
    n_b = len(row)
    for n in range(min(max_n, n_b - 1), 0, -1):
        key = row[n_b - n :]
        for p in range(n_b - n - 1, -1, -1):
            if row[p : p + n] == key:
                q = p + n
                return [row[q + k % (n_b - q)] for k in range(m)]
    return [-1] * m


def ngram_lookup_expected(tokens: torch.Tensor, length: torch.Tensor, max_n: int, m: int) -> torch.Tensor:
    """``ngram_lookup_loop`` over the rows of ``tokens (B, S)`` and ``length (B,)``: int32 ``(B, m)``."""
    rows = [ngram_lookup_loop(tokens[b, : int(length[b])].tolist(), max_n, m) for b in range(tokens.shape[0])]
    return torch.tensor(rows, dtype=torch.int32).reshape(tokens.shape[0], m)


@st.composite
def lookup_inputs(draw, max_b=4, max_s=40, alphabet=3, dtypes=(torch.int32, torch.int64)):
    """``ngram_lookup`` arguments over a tiny alphabet (repeats are common, so matches are):
    ``(tokens (B, S), length (B,), max_n, m)``, lengths anywhere in [0, S]."""
    B = draw(st.integers(1, max_b))
    S = draw(st.integers(1, max_s))
    toks = draw(st.lists(st.integers(0, alphabet - 1), min_size=B * S, max_size=B * S))
    length = draw(st.lists(st.integers(0, S), min_size=B, max_size=B))
    dtype = draw(st.sampled_from(dtypes))
    tokens = torch.tensor(toks, dtype=dtype).reshape(B, S)
    return tokens, torch.tensor(length, dtype=draw(st.sampled_from(dtypes))), draw(st.integers(1, 5)), draw(st.integers(1, 9))


def lookup_cases(seed: int, B: int, S: int, vocab: int, dtype=torch.int64):
    """Random ``ngram_lookup`` histories of B rows with a few planted repeats, lengths in [0, S]."""
    g = gen(seed)
    tokens = torch.randint(0, vocab, (B, S), generator=g, dtype=dtype)
    for b in range(B):  # copy a span to a later place so that long keys match too
        if S >= 8:
            a = int(torch.randint(0, S // 2, (1,), generator=g))
            k = int(torch.randint(2, S // 4 + 2, (1,), generator=g))
            dst = int(torch.randint(a + 1, S - k + 1, (1,), generator=g)) if a + 1 <= S - k else a
            tokens[b, dst : dst + k] = tokens[b, a : a + k].clone()
    length = torch.randint(0, S + 1, (B,), generator=g, dtype=dtype)
    length[0] = S
    return tokens, length
