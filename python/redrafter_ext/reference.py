"""Pure-PyTorch reference of every op: the oracle for tests, benchmarks and the explicit fallback.

Notation (see README): B batch rows, W beam width, L beam length including the guaranteed token,
V vocabulary, N = 1 + W*(L-1) trie nodes (node 0 is the root). Integer inputs may be int32 or
int64; integer outputs are int32; scores are float32 whatever the logits dtype.

Every function here has fixed output shapes and never reads a tensor value on the host, so the
reference can run inside ``decode_step`` (and under ``torch.compile``) unchanged. Range checks on
values use ``torch._assert_async``, which raises at once on the CPU and asynchronously on a GPU.

Each op's contract (semantics, shapes, dtypes, value rules) is written once, in the docstrings
here; the native ops (``redrafter_ext.ops``), the MLX ops and the MLX reference refer to it and
say only what differs for them.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ._checks import (
    check_beam_topk,
    check_build_trie,
    check_kv_compact,
    check_kv_compact_paged,
    check_ngram_lookup,
    check_skinny_linear,
    check_tree_mask,
    check_verify_greedy,
    check_verify_sample,
)
from ._shape_checks import OPS, nodes_ok, num_nodes_max, parents_ok, token_ids_ok
from .sampling import sample_inverse_cdf, sampling_probs

__all__ = [*OPS, "kv_compact_paged", "skinny_linear", "check_kv_compact_paged", "num_nodes_max", "sampling_probs", "sample_inverse_cdf"]


def beam_topk(
    logits: Tensor, scores: Tensor, tokens: Tensor, state: Tensor, step: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One beam-search step: log-softmax, running score, top-W over W*V, reorder by parent.

    Args:
        logits: ``(B, W, V)`` float32/float16/bfloat16 drafter logits of each beam.
        scores: ``(B, W)`` float32 running joint log-probabilities; ``[0, -inf, ...]`` at ``step == 1``
            so that only beam 0 expands.
        tokens: ``(B, W, L)`` int32/int64 token history; positions ``< step`` must hold token ids in
            ``[0, 2^31)``. The whole row is copied from the parent beam, then position ``step`` is
            overwritten.
        state: ``(B, W, D)`` float32/float16/bfloat16 drafter state of each beam after this step's
            update (reordered with its beam).
        step: position ``1 <= step < L`` written by this step.

    Returns:
        ``(scores, tokens, state, parent)``, beams sorted by score descending, ties to the lower flat
        index ``parent * V + token``:
        ``scores (B, W)`` float32, ``scores[b, parent] + log_softmax(logits[b, parent])[token]``;
        ``tokens (B, W, L)`` int32, the parent's row with position ``step`` set to the new token;
        ``state (B, W, D)``, ``state``'s dtype, the parent's row;
        ``parent (B, W)`` int32, the parent beam of each new beam.
    """
    check_beam_topk(logits, scores, tokens, state, step)
    torch._assert_async(token_ids_ok(tokens[:, :, :step]).all(),
                        "beam_topk: tokens must hold token ids in [0, 2^31) at positions < step")
    B, W, V = logits.shape
    # log_softmax written out: torch.log_softmax's fused CPU kernel accumulates the row sum in float
    # lanes (error ~2e-5 at V=128256), enough to reorder candidates of different beams that are
    # that close; torch.sum reduces pairwise (error ~1e-7), so the order is the float64 order up to
    # rounding. NaN/inf behave as in log_softmax (a row with NaN or +inf, or all -inf, is all NaN).
    x = logits.float()
    shifted = x - x.amax(dim=-1, keepdim=True)
    logsum = torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))
    cand = scores.float()[:, :, None] + (shifted - logsum)  # [B, W, V]
    # a stable descending sort keeps equal candidates in flat-index order: the documented tie rule
    order = torch.sort(cand.reshape(B, W * V), dim=-1, descending=True, stable=True).indices
    top = order[:, :W]  # [B, W]
    new_scores = torch.gather(cand.reshape(B, W * V), 1, top)
    parent = torch.div(top, V, rounding_mode="floor")
    token = top - parent * V
    new_tokens = torch.gather(tokens.to(torch.int32), 1, parent[:, :, None].expand(-1, -1, tokens.shape[2]))
    new_tokens[:, :, step] = token.to(torch.int32)
    new_state = torch.gather(state, 1, parent[:, :, None].expand(-1, -1, state.shape[2]))
    return new_scores, new_tokens, new_state, parent.to(torch.int32)


def build_trie(beams: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Merge the beams' shared prefixes into a trie (Dynamic Tree Attention).

    Position 0 of every beam is the root (node 0, the guaranteed token, taken from beam 0).
    Nodes are numbered in order of first occurrence, beam-major then depth: beam 0's L nodes,
    then the new nodes of beam 1, ... This order is topological (parent < child).

    Args:
        beams: ``(B, W, L)`` int32/int64 token ids ``>= 0``.

    Returns:
        ``(node_token, node_parent, node_depth, beam_node, num_nodes)``, all int32:
        ``node_token, node_parent, node_depth (B, N)`` with ``N = 1 + W*(L-1)`` (padding nodes: token
        0, parent -1, depth 0; the root has parent -1); ``beam_node (B, W, L)`` the node of each beam
        position; ``num_nodes (B,)`` the valid nodes per row.
    """
    check_build_trie(beams)
    # negative ids are rejected as by the native ops; int64 ids >= 2^31 are compared at full width,
    # as the CUDA kernel does (the CPU launcher rejects them: it reads every value on the host anyway)
    torch._assert_async((beams >= 0).all(), "build_trie: beams must hold token ids >= 0")
    B, W, L = beams.shape
    N = num_nodes_max(W, L)
    dev = beams.device
    beams = beams.to(torch.int32)
    draft = beams[:, :, 1:]  # [B, W, L-1]
    # same[b, w, v, d]: beams w and v agree on positions 1..d+1 (the prefix defining a node)
    same = (draft[:, :, None, :] == draft[:, None, :, :]).to(torch.int32).cumprod(dim=-1)
    # owner[b, w, d]: the lowest beam sharing that prefix, i.e. where the node first occurs
    w_idx = torch.arange(W, device=dev, dtype=torch.int32)
    cand = torch.where(same.bool(), w_idx[None, None, :, None], W)
    owner = cand.min(dim=2).values  # [B, W, L-1]
    is_new = owner == w_idx[None, :, None]
    new_flat = is_new.reshape(B, W * (L - 1)).to(torch.int32)
    node_of_new = (torch.cumsum(new_flat, dim=1) - new_flat + 1).to(torch.int32)  # node id if new
    node_of_new = node_of_new.reshape(B, W, L - 1)
    # every position takes the node id assigned at its owner beam, same depth
    pos_node = torch.gather(node_of_new, 1, owner.to(torch.int64))  # [B, W, L-1]
    beam_node = torch.cat([torch.zeros(B, W, 1, dtype=torch.int32, device=dev), pos_node], dim=2)
    parent_node = beam_node[:, :, :-1]
    depth = torch.arange(1, L, device=dev, dtype=torch.int32).expand(B, W, L - 1)

    # scatter new positions to their node slot; the rest go to a spill slot N that is dropped
    P = W * (L - 1)  # explicit: reshape(B, -1) is ambiguous when B = 0
    slot = torch.where(is_new, pos_node, N).reshape(B, P).to(torch.int64)
    node_token = torch.zeros(B, N + 1, dtype=torch.int32, device=dev)
    node_parent = torch.full((B, N + 1), -1, dtype=torch.int32, device=dev)
    node_depth = torch.zeros(B, N + 1, dtype=torch.int32, device=dev)
    node_token.scatter_(1, slot, draft.reshape(B, P))
    node_parent.scatter_(1, slot, parent_node.reshape(B, P))
    node_depth.scatter_(1, slot, depth.reshape(B, P))
    node_token[:, 0] = beams[:, 0, 0]
    node_parent[:, 0] = -1
    node_depth[:, 0] = 0
    num_nodes = (new_flat.sum(dim=1) + 1).to(torch.int32)
    return node_token[:, :N], node_parent[:, :N], node_depth[:, :N], beam_node, num_nodes


def tree_mask(node_parent: Tensor, num_nodes: Tensor, packed: bool = False) -> Tensor:
    """Ancestor-or-self mask of the trie.

    Args:
        node_parent: ``(B, N)`` int32/int64, parent of each node (-1 for the root and padding);
            every parent index is lower than its child's.
        num_nodes: ``(B,)`` int32/int64, valid nodes per row, in ``[0, N]``; rows ``>= num_nodes``
            are padding and see only themselves.
        packed: return int32 bit words instead of bools.

    Returns:
        bool ``(B, N, N)``: ``mask[b, i, j]`` is true when node j is an ancestor-or-self of node i;
        or, when ``packed``, int32 ``(B, N, ceil(N/32))`` with bit ``j % 32`` of word ``j // 32``
        set, least significant bit first.
    """
    check_tree_mask(node_parent, num_nodes)
    B, N = node_parent.shape
    dev = node_parent.device
    node = torch.arange(N, device=dev)
    valid = node[None, :] < num_nodes.to(torch.int64)[:, None]  # [B, N]
    torch._assert_async(((num_nodes >= 0) & (num_nodes <= N)).all(), f"tree_mask: num_nodes must be in [0, N={N}]")
    torch._assert_async(
        (~valid | parents_ok(node_parent, node[None, :])).all(),
        "tree_mask: node_parent[b, i] must be -1 or a lower node index (parents precede children) for i < num_nodes[b]",
    )
    # padding nodes hang from nobody, so they can neither see nor be seen by the tree
    jump = torch.where(valid, node_parent.to(torch.int64), -1)
    mask = torch.eye(N, dtype=torch.bool, device=dev).expand(B, N, N).clone()
    # pointer doubling: after k rounds mask[i] holds the ancestors at distance < 2^k and
    # jump[i] is the ancestor at distance 2^k (-1 past the root)
    for _ in range(max(1, math.ceil(math.log2(max(N, 2))))):
        has = jump >= 0
        j = jump.clamp(min=0)
        mask = mask | (torch.gather(mask, 1, j[:, :, None].expand(B, N, N)) & has[:, :, None])
        jump = torch.where(has, torch.gather(jump, 1, j), -1)
    if not packed:
        return mask
    words = (N + 31) // 32
    padded = torch.zeros(B, N, words * 32, dtype=torch.int64, device=dev)
    padded[:, :, :N] = mask.to(torch.int64)
    bits = torch.bitwise_left_shift(torch.ones(32, dtype=torch.int64, device=dev), torch.arange(32, device=dev))
    packed_words = (padded.reshape(B, N, words, 32) * bits).sum(dim=-1)
    # fold bit 31 into the sign so the word is the int32 with exactly these bits
    packed_words = torch.where(packed_words >= 2**31, packed_words - 2**32, packed_words)
    return packed_words.to(torch.int32)


def ngram_lookup(tokens: Tensor, length: Tensor, max_n: int, m: int) -> Tensor:
    """Prompt-lookup drafts: the ``m`` tokens that followed the latest earlier occurrence of each
    row's last tokens (the lookup beam of ``decode_step``; docs/lookup.md).

    For row b with ``n_b = length[b]`` tokens ``t = tokens[b, :n_b]``: for key lengths
    ``n = min(max_n, n_b - 1)`` down to 1, the key is ``t[n_b-n:]`` and an occurrence is a start
    ``p`` in ``[0, n_b-n-1]`` with ``t[p:p+n] == key`` (it may overlap the key); the first key
    length with an occurrence wins, and its largest ``p``. With ``q = p + n`` and the period
    ``d = n_b - q >= 1``, ``drafts[b, k] = t[q + k % d]``: the continuation, repeated with the
    period of the match where it reaches the end of the row. A row without an occurrence (or
    with ``n_b <= 1``) gets -1 everywhere.

    Args:
        tokens: ``(B, S)`` int32/int64, each row's history; only ``tokens[b, :length[b]]`` is read,
            and its values are only compared and copied.
        length: ``(B,)`` int32/int64, in ``[0, S]``.
        max_n: the longest key, ``>= 1``.
        m: drafts per row, ``>= 1``.

    Returns:
        ``(B, m)`` int32 drafts, -1 for rows without an occurrence.
    """
    check_ngram_lookup(tokens, length, max_n, m)
    B, S = tokens.shape
    dev = tokens.device
    torch._assert_async(((length >= 0) & (length <= S)).all(), f"ngram_lookup: length must be in [0, S={S}]")
    t = tokens.to(torch.int64)
    n_b = length.to(torch.int64).clamp(0, S)[:, None]  # [B, 1]
    end = torch.arange(S, device=dev)[None, :]  # an occurrence's last position e = p + n - 1
    # run[b, e]: how many trailing tokens ending at e equal those ending at n_b - 1 (at most max_n)
    still = torch.ones(B, S, dtype=torch.bool, device=dev)
    run = torch.zeros(B, S, dtype=torch.int64, device=dev)
    for j in range(min(max_n, S)):
        a = t.gather(1, (end - j).clamp(min=0).expand(B, S))
        b = t.gather(1, (n_b - 1 - j).clamp(min=0))
        still = still & (end - j >= 0) & (n_b - 1 - j >= 0) & (a == b)
        run = run + still
    # the longest key, then the latest occurrence: one max over run * (S + 1) + e; e <= n_b - 2
    # leaves a continuation token before the key's last one
    score = torch.where(end <= n_b - 2, run * (S + 1) + end, 0)
    best = score.amax(dim=1, keepdim=True)
    found = best >= S + 1
    q = best % (S + 1) + 1
    period = (n_b - q).clamp(min=1)
    idx = q + torch.arange(m, device=dev)[None, :] % period
    return torch.where(found, t.gather(1, idx.clamp(0, S - 1)), -1).to(torch.int32)


def _assert_beam_values(op: str, logits: Tensor, beams: Tensor, beam_node: Tensor) -> None:
    """The native ops' value rules for beams and beam_node, checked before any gather uses them."""
    torch._assert_async(token_ids_ok(beams).all(), f"{op}: beams must hold token ids in [0, 2^31)")
    n = logits.shape[1]
    torch._assert_async(nodes_ok(beam_node, n).all(), f"{op}: beam_node must be in [0, {n}) (the nodes of logits, dim 1)")


def verify_greedy(logits: Tensor, beams: Tensor, beam_node: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Greedy acceptance: the longest beam whose draft tokens equal the target's argmax.

    Along beam w the accepted length is the number of leading draft tokens ``beams[b, w, d+1]``
    equal to the argmax of ``logits[b, beam_node[b, w, d]]`` (first maximum on ties, like
    ``torch.argmax``).

    Args:
        logits: ``(B, N', V)`` float32/float16/bfloat16 target logits at each trie node,
            ``N' >= 1 + W*(L-1)``.
        beams: ``(B, W, L)`` int32/int64 draft beams (position 0 is the guaranteed token), token ids
            in ``[0, 2^31)``.
        beam_node: ``(B, W, L)`` int32/int64 node of each beam position (from ``build_trie``), in
            ``[0, N')``.

    Returns:
        ``(accept_len, best_beam, path_nodes, next_token)``, all int32: ``accept_len (B,)`` accepted
        draft tokens (0..L-1); ``best_beam (B,)`` the beam achieving it (ties to the lowest beam);
        ``path_nodes (B, L)`` the nodes of the accepted path, root first, -1 past ``accept_len``;
        ``next_token (B,)`` the target's argmax at the last accepted node.
    """
    check_verify_greedy(logits, beams, beam_node)
    _assert_beam_values("verify_greedy", logits, beams, beam_node)
    B, W, L = beams.shape
    target = logits.argmax(dim=-1).to(torch.int32)  # [B, N]; first maximum on ties
    bn = beam_node.to(torch.int64)
    pred = torch.gather(target, 1, bn.reshape(B, W * L)).reshape(B, W, L)  # argmax at each node
    match = (beams[:, :, 1:].to(torch.int32) == pred[:, :, :-1]).to(torch.int32)
    accept = match.cumprod(dim=-1).sum(dim=-1)  # [B, W]
    accept_len, best = accept.max(dim=1)  # max returns the first maximal index
    path = torch.gather(bn, 1, best[:, None, None].expand(B, 1, L)).reshape(B, L)
    i = torch.arange(L, device=beams.device)
    path_nodes = torch.where(i[None, :] <= accept_len[:, None], path, -1)
    last = torch.gather(path, 1, accept_len[:, None].to(torch.int64))
    next_token = torch.gather(target, 1, last).reshape(B)
    return accept_len.to(torch.int32), best.to(torch.int32), path_nodes.to(torch.int32), next_token


def verify_sample(
    logits: Tensor, beams: Tensor, beam_node: Tensor, accept_u: Tensor, sample_u: Tensor, temperature: float,
    top_k: int = 0, top_p: float = 1.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Exact sampling: recursive rejection over the trie, the sampling counterpart of ``verify_greedy``.

    With ``p`` the target's distribution at a node (``sampling_probs``: temperature, top-k, top-p,
    float64), starting at the root: try the node's distinct children in beam order (child ``c`` ranks
    by the lowest beam passing through it); the j-th child tried, with token ``t``, is accepted when
    ``accept_u[b, depth, j] * mass < p(t)`` (float64), ``mass`` being the sum of the not yet
    rejected ``p`` in index order, i.e. with probability ``p(t)`` renormalised; on rejection
    ``p(t) = 0``. An accepted child becomes the current node (the walk stops at depth L-1); when
    every child is rejected (or at a leaf) the next token is drawn from the remaining ``p`` by
    inverse CDF with ``sample_u[b]``. The committed tokens (accepted drafts + next token) are then
    distributed exactly as the target's when the uniforms are i.i.d. U[0, 1) and the beams do not
    depend on them. ``temperature == 0`` is ``verify_greedy`` exactly (the uniforms are unused).

    Randomness enters only through the two uniform tensors: fixed shapes, no host RNG, no host
    synchronisation, deterministic given its inputs.

    Args:
        logits: ``(B, N', V)`` float32/float16/bfloat16 target logits at each trie node,
            ``N' >= 1 + W*(L-1)``.
        beams: ``(B, W, L)`` int32/int64 draft beams (position 0 is the guaranteed token; draft
            tokens at positions ``>= 1`` in ``[0, V)``).
        beam_node: ``(B, W, L)`` int32/int64 node of each beam position (from ``build_trie``), in
            ``[0, N')``.
        accept_u: ``(B, L-1, W)`` float32 uniforms in ``[0, 1)``: ``accept_u[b, d, j]`` decides the
            j-th distinct child tried at depth d (at most W children per node).
        sample_u: ``(B,)`` float32 uniform in ``[0, 1)`` for the final (next) token.
        temperature: float ``>= 0``; 0 means greedy.
        top_k: int ``>= 0``, 0 is off.
        top_p: float in ``(0, 1]``, 1 is off.

    Returns:
        As ``verify_greedy``, all int32: ``accept_len (B,)`` (0..L-1), ``best_beam (B,)`` (the lowest
        beam containing the accepted path), ``path_nodes (B, L)`` (root first, -1 past
        ``accept_len``), ``next_token (B,)`` (the token sampled at the stop node).
    """
    check_verify_sample(logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p)
    # the uniforms are checked even when greedy ignores them, as the native op does
    torch._assert_async(
        ((accept_u >= 0) & (accept_u < 1)).all() & ((sample_u >= 0) & (sample_u < 1)).all(),
        "verify_sample: accept_u and sample_u must be in [0, 1)",
    )
    if float(temperature) == 0.0:
        return verify_greedy(logits, beams, beam_node)
    _assert_beam_values("verify_sample", logits, beams, beam_node)
    B, W, L = beams.shape
    dev = logits.device
    p = sampling_probs(logits, float(temperature), int(top_k), float(top_p))  # [B, N', V] float64
    V = p.shape[-1]
    torch._assert_async(
        ((beams[:, :, 1:] >= 0) & (beams[:, :, 1:] < V)).all(),
        "verify_sample: draft tokens beams[:, :, 1:] must be in [0, V)",
    )
    bn = beam_node.to(torch.int64)
    tok = beams.to(torch.int64)
    w_idx = torch.arange(W, device=dev)
    # first[b, w, d]: beam w is the lowest beam through its node at depth d+1 (a distinct child)
    same = bn[:, :, None, 1:] == bn[:, None, :, 1:]  # [B, W(w), W(v), L-1]
    lower = (w_idx[None, :] < w_idx[:, None])[None, :, :, None]  # v < w
    first = ~(same & lower).any(dim=2)  # [B, W, L-1]

    rows = torch.arange(B, device=dev)
    cur = bn[:, 0, 0]
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    accept_len = torch.zeros(B, dtype=torch.int64, device=dev)
    resid = torch.zeros(B, V, dtype=p.dtype, device=dev)
    for d in range(L - 1):
        q = p[rows, cur]  # [B, V]
        accepted = torch.zeros(B, dtype=torch.bool, device=dev)
        child = cur
        rank = torch.zeros(B, dtype=torch.int64, device=dev)
        for w in range(W):
            cand = alive & ~accepted & first[:, w, d] & (bn[:, w, d] == cur)
            t = tok[:, w, d + 1]
            pt = torch.gather(q, 1, t[:, None])[:, 0]
            mass = q.cumsum(dim=-1)[:, -1]
            u = torch.gather(accept_u[:, d, :], 1, rank.clamp(max=W - 1)[:, None])[:, 0].double()
            acc = cand & (u * mass < pt)
            rej = cand & ~acc
            q = q.scatter(1, t[:, None], torch.where(rej, 0.0, pt)[:, None])
            accepted |= acc
            child = torch.where(acc, bn[:, w, d + 1], child)
            rank += cand.to(torch.int64)
        stop = alive & ~accepted
        resid = torch.where(stop[:, None], q, resid)
        accept_len += (alive & accepted).to(torch.int64)
        cur = torch.where(alive & accepted, child, cur)
        alive &= accepted
    resid = torch.where(alive[:, None], p[rows, cur], resid)
    next_token = sample_inverse_cdf(resid, sample_u)
    # the lowest beam through the last accepted node (a trie node fixes its whole prefix)
    at_last = torch.gather(bn, 2, accept_len[:, None, None].expand(B, W, 1))[:, :, 0] == cur[:, None]
    best = torch.where(at_last, w_idx[None, :], W).amin(dim=1)
    path = torch.gather(bn, 1, best[:, None, None].expand(B, 1, L)).reshape(B, L)
    i = torch.arange(L, device=dev)
    path_nodes = torch.where(i[None, :] <= accept_len[:, None], path, -1)
    return accept_len.to(torch.int32), best.to(torch.int32), path_nodes.to(torch.int32), next_token


def _assert_kv_rows(op: str, acc: Tensor, base: Tensor, path: Tensor, S: int, s_is: str) -> Tensor:
    """The row rule of both kv_compact ops (the CPU launchers' ``check_kv_row``), asserted on the
    device: accept_len in [-1, L-1], cache_len in [0, S], and at every accepted position i
    ``path[b, i] >= i`` and ``cache_len[b] + path[b, i] < S``. Returns the accepted positions (B, L)."""
    L = path.shape[1]
    i = torch.arange(L, device=path.device)
    valid = i[None, :] <= acc[:, None]  # [B, L]; none in an inactive row, so a full cache is fine there
    torch._assert_async(((acc >= -1) & (acc < L)).all(), f"{op}: accept_len must be in [-1, L-1]")
    torch._assert_async(((base >= 0) & (base <= S)).all(), f"{op}: cache_len must be in [0, S] ({s_is})")
    torch._assert_async((~valid | (path >= i[None, :])).all(), f"{op}: path_nodes must satisfy path_nodes[b, i] >= i")
    torch._assert_async((~valid | (base[:, None] + path < S)).all(),
                        f"{op}: cache_len + path_nodes exceeds the row capacity S ({s_is})")
    return valid


def kv_compact(kv: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor) -> None:
    """Keep only the accepted path's K/V, in place, and advance ``cache_len``.

    For each row b and ``i = 0..accept_len[b]``, copy slot ``cache_len[b] + path_nodes[b, i]`` to
    slot ``cache_len[b] + i`` in every layer, K and V; then ``cache_len[b] += accept_len[b] + 1``.
    ``accept_len[b] == -1`` marks an inactive row (finished): nothing is copied or advanced.

    Args:
        kv: ``(n_layers, 2, B, H_kv, S, D)`` contiguous float32/float16/bfloat16 cache (modified).
        cache_len: ``(B,)`` int32 tokens already committed per row, in ``[0, S]`` (modified).
        path_nodes: ``(B, L)`` int32/int64 accepted path from ``verify_greedy``, ``1 <= L <= S``:
            ``path_nodes[b, i] >= i`` and ``cache_len[b] + path_nodes[b, i] < S`` for
            ``i <= accept_len[b]``; ignored past it.
        accept_len: ``(B,)`` int32/int64 in ``[-1, L-1]``.
    """
    check_kv_compact(kv, cache_len, path_nodes, accept_len)
    n_layers, two, B, H, S, D = kv.shape
    L = path_nodes.shape[1]
    i = torch.arange(L, device=kv.device)
    acc = accept_len.to(torch.int64)
    base = cache_len.to(torch.int64)
    path = path_nodes.to(torch.int64)
    _assert_kv_rows("kv_compact", acc, base, path, S, "kv.shape[4]")
    # rewrite a window of L distinct slots per row (shifted inside the cache near its end), so the
    # scatter has no duplicate destinations; slots outside the accepted range are rewritten as is
    start = base.clamp(max=S - L)
    slot = start[:, None] + i[None, :]  # [B, L]
    rel = slot - base[:, None]  # path position each slot receives
    take = (rel >= 0) & (rel <= acc[:, None])
    src = torch.where(take, base[:, None] + torch.gather(path, 1, rel.clamp(0, L - 1)), slot)
    shape = (n_layers, two, B, H, L, D)
    moved = torch.gather(kv, 4, src[None, None, :, None, :, None].expand(shape))
    kv.scatter_(4, slot[None, None, :, None, :, None].expand(shape), moved)
    cache_len.add_((acc + 1).to(cache_len.dtype))


def kv_compact_paged(
    kv_pages: Tensor, block_table: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor
) -> None:
    """``kv_compact`` on a paged (vLLM-style) cache, in place, every layer in one call.

    Logical slot s of row b lives in physical block ``block_table[b, s // block_size]`` at offset
    ``s % block_size``. For each active row b and ``i = 0..accept_len[b]``, logical slot
    ``cache_len[b] + path_nodes[b, i]`` is copied to logical slot ``cache_len[b] + i`` in every
    layer, K and V; then ``cache_len[b] += accept_len[b] + 1``. ``accept_len[b] == -1``: inactive row
    (nothing read, copied or advanced; its block table is not looked at).

    Args:
        kv_pages: ``(n_layers, num_blocks, 2, H_kv, block_size, D)`` contiguous pages, float32,
            float16 or bfloat16 (modified); layers are stacked so that one call (one launch) covers
            them all.
        block_table: ``(B, max_blocks)`` int32; a row holds ``S = max_blocks * block_size`` slots.
            The blocks of the slots a step reads or writes must hold ids in ``[0, num_blocks)`` and
            belong to one (row, logical block) each (no block shared between them).
        cache_len, path_nodes, accept_len: as in ``kv_compact``, with ``S`` the logical length.
    """
    check_kv_compact_paged(kv_pages, block_table, cache_len, path_nodes, accept_len)
    n_layers, num_blocks, _, H, bs, D = kv_pages.shape
    B, max_blocks = block_table.shape
    if B == 0:
        return
    L = path_nodes.shape[1]
    S = max_blocks * bs
    dev = kv_pages.device
    i = torch.arange(L, device=dev)
    acc = accept_len.to(torch.int64)
    base = cache_len.to(torch.int64)
    path = path_nodes.to(torch.int64)
    table = block_table.to(torch.int64)
    op = "kv_compact_paged"
    valid = _assert_kv_rows(op, acc, base, path, S, "max_blocks * block_size")
    # logical -> (logical block, physical block, offset); positions past accept_len are clamped into
    # range so that every gather is legal (their values are never used)
    src = (base[:, None] + torch.where(valid, path, 0)).clamp(0, S - 1)  # [B, L]
    dst = (base[:, None] + i[None, :]).clamp(0, S - 1)
    src_j, dst_j = src // bs, dst // bs
    src_blk, dst_blk = torch.gather(table, 1, src_j), torch.gather(table, 1, dst_j)
    blk = torch.cat([src_blk, dst_blk], 1)  # [B, 2L]
    both = torch.cat([valid, valid], 1)
    torch._assert_async(
        (~both | ((blk >= 0) & (blk < num_blocks))).all(),
        f"{op}: block_table holds a block id outside [0, num_blocks) for a slot that is read or written",
    )
    # no physical block reached from two (row, logical block) pairs: sort the touched blocks
    # (untouched entries get distinct negative keys) and compare the owners of equal neighbours
    owner = torch.arange(B, device=dev)[:, None] * max_blocks + torch.cat([src_j, dst_j], 1)
    key = torch.where(both, blk, -1 - torch.arange(2 * B * L, device=dev).view(B, 2 * L)).flatten()
    key, order = torch.sort(key, stable=True)
    owner = owner.flatten()[order]
    torch._assert_async(
        ((key[1:] != key[:-1]) | (owner[1:] == owner[:-1])).all(),
        f"{op}: a block a step reads or writes is shared by two (row, logical block) pairs of block_table",
    )
    # gather every source, then scatter. Positions past accept_len repeat the copy of the first
    # accepted position of the batch (a self-copy of slot 0 of block 0 when there is none): their
    # duplicate destinations carry the same value, so the scatter is deterministic.
    src_blk, dst_blk = src_blk.clamp(0, num_blocks - 1), dst_blk.clamp(0, num_blocks - 1)
    src_off, dst_off = src % bs, dst % bs
    flat = valid.flatten()
    first = torch.where(flat, torch.arange(B * L, device=dev), B * L).amin().clamp(max=B * L - 1).view(1)
    has = flat.gather(0, first)  # (1,): gathers, not a 0-dim index (that would read it on the host)

    def pick(t: Tensor) -> Tensor:
        return torch.where(valid, t, torch.where(has, t.flatten().gather(0, first), 0))

    moved = kv_pages[:, pick(src_blk), :, :, pick(src_off)]  # [B, L, n_layers, 2, H, D]
    kv_pages[:, pick(dst_blk), :, :, pick(dst_off)] = moved
    cache_len.add_((acc + 1).to(cache_len.dtype))


def skinny_linear(x: Tensor, packed: Tensor, out_features: int, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T (+ bias)`` over a weight packed by ``ops.skinny_pack``.

    Args:
        x: ``(M, K)`` float32.
        packed: ``(ceil(N/4), ceil(K/16), 4, 16)`` float32, ``ops.skinny_pack(weight)`` of the
            ``(N, K)`` weight (4 x 16 tiles, zero-padded), on x's device.
        out_features: N ``>= 0``, the weight's rows.
        bias: ``(N,)`` float32 or None.

    Returns:
        ``(M, N)`` float32.
    """
    check_skinny_linear(x, packed, out_features, bias)
    T, KB, NR, KW = packed.shape
    weight = packed.permute(0, 2, 1, 3).reshape(T * NR, KB * KW)[:out_features, : x.shape[1]]
    return torch.nn.functional.linear(x, weight, bias)
