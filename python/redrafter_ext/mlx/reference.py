"""Pure ``mlx.core`` reference of every op: the MLX oracle, same semantics as ``redrafter_ext.reference``.

Each op's contract (semantics, shapes, dtypes; notation B, W, L, V, N) is written once, in the
docstring of the same-named function of ``redrafter_ext.reference``; the docstrings here say only
what differs on MLX.

Differences from the PyTorch reference, all forced by MLX being functional and lazy:
- ``kv_compact`` cannot write in place: it returns ``(kv, cache_len)``.
- Value-range checks (``torch._assert_async`` there) would need a host read here, so only metadata
  (type, rank, dtype, shape) is checked; every gather/scatter index is clamped into range instead,
  so out-of-contract values give wrong numbers, never out-of-bounds memory accesses.
- ``verify_sample``/``sampling_probs`` compute in float64, which MLX supports on the CPU only: they
  run on the CPU stream (on Apple silicon the memory is shared, so this costs no copy). MLX's
  float64 ``exp`` is only float32-accurate, so ``exp`` is computed here to within 1 ulp (the torch
  reference's is within 1 ulp too: probabilities agree to ~1e-16 relative, not bit for bit, so a
  sampling decision can differ only when a uniform falls within ~1e-16 of its threshold).

No function here reads a value on the host (no ``.item()``, ``.tolist()``, numpy conversion or
Python branching on array values): every output has a fixed shape and stays lazy.
"""

from __future__ import annotations

import math

import mlx.core as mx

from .._shape_checks import OPS, num_nodes_max, parents_ok
from . import _checks
from .sampling import sample_inverse_cdf, sampling_probs

__all__ = [*OPS, "num_nodes_max", "sampling_probs", "sample_inverse_cdf"]


def _gather(a: mx.array, idx: mx.array, axis: int) -> mx.array:
    """``torch.gather`` with the index clamped into ``[0, a.shape[axis])`` (MLX does not bound-check)."""
    idx = mx.clip(idx.astype(mx.int32), 0, a.shape[axis] - 1)
    shape = list(a.shape)
    shape[axis] = idx.shape[axis]
    return mx.take_along_axis(a, mx.broadcast_to(idx, shape), axis=axis)


# -- ops ------------------------------------------------------------------------------------------


def beam_topk(
    logits: mx.array, scores: mx.array, tokens: mx.array, state: mx.array, step: int
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """One beam-search step: ``redrafter_ext.reference.beam_topk`` in ``mlx.core``."""
    _checks.check_beam_topk(logits, scores, tokens, state, step)
    B, W, V = logits.shape
    L = tokens.shape[2]

    # log_softmax written out as in the torch reference (max-shift, exp, sum, log)
    x = logits.astype(mx.float32)
    shifted = x - mx.max(x, axis=-1, keepdims=True)
    logsum = mx.log(mx.sum(mx.exp(shifted), axis=-1, keepdims=True))
    cand = (scores[:, :, None] + (shifted - logsum)).reshape(B, W * V)
    # MLX's sort is stable and ascending with NaN last; sorting -cand with NaN mapped to -inf gives
    # torch's stable descending order (NaN first, equal candidates in flat-index order)
    key = mx.where(mx.isnan(cand), -math.inf, -cand)
    top = mx.argsort(key, axis=-1)[:, :W].astype(mx.int32)  # [B, W]
    new_scores = mx.take_along_axis(cand, top, axis=1)
    parent = top // V
    token = top - parent * V
    new_tokens = _gather(tokens.astype(mx.int32), parent[:, :, None], 1)
    new_tokens = mx.where(mx.arange(L)[None, None, :] == step, token[:, :, None], new_tokens)
    new_state = _gather(state, parent[:, :, None], 1)
    return new_scores, new_tokens, new_state, parent


def build_trie(beams: mx.array) -> tuple[mx.array, mx.array, mx.array, mx.array, mx.array]:
    """Merge the beams' shared prefixes into a trie: ``redrafter_ext.reference.build_trie`` in ``mlx.core``."""
    _checks.check_build_trie(beams)
    B, W, L = beams.shape
    N = num_nodes_max(W, L)
    beams = beams.astype(mx.int32)
    root = beams[:, 0, 0]
    if L == 1:  # only the root: no zero-size arrays through the ops below
        z = mx.zeros((B, 1), dtype=mx.int32)
        return root[:, None], z - 1, z, mx.zeros((B, W, 1), dtype=mx.int32), mx.ones((B,), dtype=mx.int32)
    draft = beams[:, :, 1:]  # [B, W, L-1]
    # same[b, w, v, d]: beams w and v agree on positions 1..d+1 (the prefix defining a node)
    same = mx.cumprod((draft[:, :, None, :] == draft[:, None, :, :]).astype(mx.int32), axis=-1)
    w_idx = mx.arange(W, dtype=mx.int32)
    # owner[b, w, d]: the lowest beam sharing that prefix, i.e. where the node first occurs
    owner = mx.min(mx.where(same > 0, w_idx[None, None, :, None], W), axis=2)  # [B, W, L-1]
    is_new = owner == w_idx[None, :, None]
    new_flat = is_new.reshape(B, W * (L - 1)).astype(mx.int32)
    node_of_new = (mx.cumsum(new_flat, axis=1) - new_flat + 1).reshape(B, W, L - 1)
    pos_node = mx.take_along_axis(node_of_new, owner, axis=1)  # [B, W, L-1]
    beam_node = mx.concatenate([mx.zeros((B, W, 1), dtype=mx.int32), pos_node], axis=2)
    parent_node = beam_node[:, :, :-1]
    depth = mx.broadcast_to(mx.arange(1, L, dtype=mx.int32), (B, W, L - 1))

    # scatter the new positions to their node slot; the rest go to a spill slot N that is dropped
    P = W * (L - 1)  # explicit: reshape(B, -1) is ambiguous when B = 0
    slot = mx.where(is_new, pos_node, N).reshape(B, P)
    ones = mx.ones((B, N + 1), dtype=mx.int32)
    node_token = mx.put_along_axis(ones * 0, slot, draft.reshape(B, P), axis=1)[:, :N]
    node_parent = mx.put_along_axis(-ones, slot, parent_node.reshape(B, P), axis=1)[:, :N]
    node_depth = mx.put_along_axis(ones * 0, slot, depth.reshape(B, P), axis=1)[:, :N]
    first = mx.arange(N)[None, :] == 0
    node_token = mx.where(first, root[:, None], node_token)
    node_parent = mx.where(first, -1, node_parent)
    node_depth = mx.where(first, 0, node_depth)
    num_nodes = (mx.sum(new_flat, axis=1) + 1).astype(mx.int32)
    return node_token, node_parent, node_depth, beam_node, num_nodes


def ngram_lookup(tokens: mx.array, length: mx.array, max_n: int, m: int) -> mx.array:
    """Prompt-lookup drafts: ``redrafter_ext.reference.ngram_lookup`` in ``mlx.core``.

    A ``length`` outside ``[0, S]`` is clamped into it (as in the native op) instead of raising.
    """
    _checks.check_ngram_lookup(tokens, length, max_n, m)
    B, S = tokens.shape
    n_b = mx.clip(length.astype(mx.int64), 0, S)[:, None]  # [B, 1]
    end = mx.arange(S, dtype=mx.int64)[None, :]  # an occurrence's last position e = p + n - 1
    # run[b, e]: how many trailing tokens ending at e equal those ending at n_b - 1 (at most max_n)
    still = mx.ones((B, S), dtype=mx.bool_)
    run = mx.zeros((B, S), dtype=mx.int64)
    for j in range(min(max_n, S)):
        a = _gather(tokens, mx.broadcast_to(end - j, (B, S)), 1)
        b = _gather(tokens, n_b - 1 - j, 1)
        still = still & (end - j >= 0) & (n_b - 1 - j >= 0) & (a == b)
        run = run + still.astype(mx.int64)
    # the longest key, then the latest occurrence: one max over run * (S + 1) + e; e <= n_b - 2
    # leaves a continuation token before the key's last one
    score = mx.where(end <= n_b - 2, run * (S + 1) + end, 0)
    best = mx.max(score, axis=1, keepdims=True)
    found = best >= S + 1
    q = best % (S + 1) + 1
    period = mx.maximum(n_b - q, 1)
    idx = q + mx.arange(m, dtype=mx.int64)[None, :] % period
    return mx.where(found, _gather(tokens, idx, 1), -1).astype(mx.int32)


def tree_mask(node_parent: mx.array, num_nodes: mx.array, packed: bool = False) -> mx.array:
    """Ancestor-or-self mask of the trie: ``redrafter_ext.reference.tree_mask`` in ``mlx.core``.

    Any other parent than -1 or a lower node (a self-parent, a cycle) makes the node a root, as in the
    native op, instead of raising.
    """
    _checks.check_tree_mask(node_parent, num_nodes)
    B, N = node_parent.shape
    node = mx.arange(N, dtype=mx.int32)
    valid = node[None, :] < num_nodes.astype(mx.int32)[:, None]
    # padding nodes hang from nobody, so they can neither see nor be seen by the tree; a parent that
    # is not -1 or a lower node (a self-parent, a cycle, out of range) makes the node a root, as in
    # the native kernel
    parent = node_parent.astype(mx.int32)
    jump = mx.where(valid & parents_ok(parent, node[None, :]), parent, -1)
    mask = mx.broadcast_to(node[:, None] == node[None, :], (B, N, N))
    # pointer doubling: after k rounds mask[i] holds the ancestors at distance < 2^k and jump[i]
    # is the ancestor at distance 2^k (-1 past the root)
    for _ in range(max(1, math.ceil(math.log2(max(N, 2))))):
        has = jump >= 0
        j = mx.maximum(jump, 0)
        mask = mask | (_gather(mask, j[:, :, None], 1) & has[:, :, None])
        jump = mx.where(has, mx.take_along_axis(jump, j, axis=1), -1)
    if not packed:
        return mask
    words = (N + 31) // 32
    bits = mask.astype(mx.uint32)
    if words * 32 > N:
        bits = mx.concatenate([bits, mx.zeros((B, N, words * 32 - N), dtype=mx.uint32)], axis=2)
    weight = mx.left_shift(mx.array(1, dtype=mx.uint32), mx.arange(32, dtype=mx.uint32))
    # distinct powers of two: the uint32 sum is the OR; view reinterprets bit 31 as the sign
    packed_words = mx.sum(bits.reshape(B, N, words, 32) * weight, axis=-1).astype(mx.uint32)
    return mx.view(packed_words, mx.int32)


def verify_greedy(
    logits: mx.array, beams: mx.array, beam_node: mx.array
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Greedy acceptance: ``redrafter_ext.reference.verify_greedy`` in ``mlx.core``."""
    _checks.check_verify_greedy(logits, beams, beam_node)
    B, W, L = beams.shape
    target = mx.argmax(logits, axis=-1).astype(mx.int32)  # [B, N]; first maximum on ties
    bn = mx.clip(beam_node.astype(mx.int32), 0, logits.shape[1] - 1)
    pred = mx.take_along_axis(target, bn.reshape(B, W * L), axis=1).reshape(B, W, L)
    match = (beams[:, :, 1:].astype(mx.int32) == pred[:, :, :-1]).astype(mx.int32)
    accept = mx.sum(mx.cumprod(match, axis=-1), axis=-1)  # [B, W]
    accept_len = mx.max(accept, axis=1).astype(mx.int32)
    best = mx.argmax(accept, axis=1).astype(mx.int32)  # first maximal beam
    path = _gather(bn, best[:, None, None], 1).reshape(B, L)
    i = mx.arange(L, dtype=mx.int32)
    path_nodes = mx.where(i[None, :] <= accept_len[:, None], path, -1)
    last = _gather(path, accept_len[:, None], 1)
    next_token = mx.take_along_axis(target, last, axis=1).reshape(B)
    return accept_len, best, path_nodes, next_token


def verify_sample(
    logits: mx.array, beams: mx.array, beam_node: mx.array, accept_u: mx.array, sample_u: mx.array,
    temperature: float, top_k: int = 0, top_p: float = 1.0,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Exact sampling over the trie: ``redrafter_ext.reference.verify_sample`` in ``mlx.core``.

    The float64 part runs on the CPU stream (MLX has float64 there only).
    """
    _checks.check_verify_sample(logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p)
    B, W, L = beams.shape
    if float(temperature) == 0.0:
        return verify_greedy(logits, beams, beam_node)

    with mx.stream(mx.cpu):  # float64 below
        p = sampling_probs(logits, float(temperature), int(top_k), float(top_p))  # [B, N', V]
        Np, V = p.shape[1], p.shape[2]
        bn = mx.clip(beam_node.astype(mx.int32), 0, Np - 1)
        tok = mx.clip(beams.astype(mx.int32), 0, V - 1)
        w_idx = mx.arange(W, dtype=mx.int32)
        v_idx = mx.arange(V, dtype=mx.int32)
        # first[b, w, d]: beam w is the lowest beam through its node at depth d+1 (a distinct child)
        if L > 1:
            same = bn[:, :, None, 1:] == bn[:, None, :, 1:]  # [B, W(w), W(v), L-1]
            lower = (w_idx[None, :] < w_idx[:, None])[None, :, :, None]
            first = ~mx.any(same & lower, axis=2)  # [B, W, L-1]

        def row_of(node: mx.array) -> mx.array:  # p[b, node[b]] -> [B, V]
            return mx.take_along_axis(p, mx.broadcast_to(node[:, None, None], (B, 1, V)), axis=1)[:, 0]

        cur = bn[:, 0, 0]
        alive = mx.ones((B,), dtype=mx.bool_)
        accept_len = mx.zeros((B,), dtype=mx.int32)
        resid = mx.zeros((B, V), dtype=mx.float64)
        for d in range(L - 1):
            q = row_of(cur)
            accepted = mx.zeros((B,), dtype=mx.bool_)
            child = cur
            rank = mx.zeros((B,), dtype=mx.int32)
            for w in range(W):
                cand = alive & ~accepted & first[:, w, d] & (bn[:, w, d] == cur)
                t = tok[:, w, d + 1]
                pt = mx.take_along_axis(q, t[:, None], axis=1)[:, 0]
                mass = mx.cumsum(q, axis=-1)[:, -1]
                u = mx.take_along_axis(accept_u[:, d, :], mx.minimum(rank, W - 1)[:, None], axis=1)[:, 0]
                acc = cand & (u.astype(mx.float64) * mass < pt)
                rej = cand & ~acc
                q = mx.where(rej[:, None] & (v_idx[None, :] == t[:, None]), 0.0, q)
                accepted = accepted | acc
                child = mx.where(acc, bn[:, w, d + 1], child)
                rank = rank + cand.astype(mx.int32)
            stop = alive & ~accepted
            resid = mx.where(stop[:, None], q, resid)
            accept_len = accept_len + (alive & accepted).astype(mx.int32)
            cur = mx.where(alive & accepted, child, cur)
            alive = alive & accepted
        resid = mx.where(alive[:, None], row_of(cur), resid)
        next_token = sample_inverse_cdf(resid, sample_u)
        # the lowest beam through the last accepted node (a trie node fixes its whole prefix)
        at_last = _gather(bn, mx.broadcast_to(accept_len[:, None, None], (B, W, 1)), 2)[:, :, 0] == cur[:, None]
        best = mx.min(mx.where(at_last, w_idx[None, :], W), axis=1).astype(mx.int32)
        path = _gather(bn, best[:, None, None], 1).reshape(B, L)
        i = mx.arange(L, dtype=mx.int32)
        path_nodes = mx.where(i[None, :] <= accept_len[:, None], path, -1)
        return accept_len, best, path_nodes, next_token


def kv_compact(
    kv: mx.array, cache_len: mx.array, path_nodes: mx.array, accept_len: mx.array
) -> tuple[mx.array, mx.array]:
    """Keep only the accepted path's K/V: ``redrafter_ext.reference.kv_compact`` in ``mlx.core``, functional.

    Returns:
        ``(kv, cache_len)``: the new cache (same shape and dtype) and the new lengths (int32).
    """
    _checks.check_kv_compact(kv, cache_len, path_nodes, accept_len)
    n_layers, two, B, H, S, D = kv.shape
    L = path_nodes.shape[1]
    i = mx.arange(L, dtype=mx.int32)
    acc = accept_len.astype(mx.int32)
    base = cache_len
    path = path_nodes.astype(mx.int32)
    # rewrite a window of L distinct slots per row (shifted inside the cache near its end), so the
    # scatter has no duplicate destinations; slots outside the accepted range are rewritten as is
    start = mx.clip(base, 0, S - L)
    slot = start[:, None] + i[None, :]  # [B, L]
    rel = slot - base[:, None]
    take = (rel >= 0) & (rel <= acc[:, None])
    src = mx.where(take, base[:, None] + _gather(path, rel, 1), slot)
    src = mx.clip(src, 0, S - 1)
    shape = (n_layers, two, B, H, L, D)
    moved = mx.take_along_axis(kv, mx.broadcast_to(src[None, None, :, None, :, None], shape), axis=4)
    kv = mx.put_along_axis(kv, mx.broadcast_to(slot[None, None, :, None, :, None], shape), moved, axis=4)
    return kv, cache_len + (acc + 1).astype(mx.int32)
