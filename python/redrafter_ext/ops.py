"""Native ops (namespace ``torch.ops.redrafter``): thin wrappers with the reference's signatures.

Each wrapper calls the registered C++/CUDA kernel (every op has both, listed in ``NATIVE_OPS``); a
fake (meta) kernel registered here gives output shapes to ``torch.compile`` and FakeTensor tracing
without running anything.

The native kernels read index inputs on the host to validate them (token ids, node ids, lengths)
and raise ``ValueError``/``TypeError`` naming the argument before anything is written. Integer
inputs may be int32 or int64; integer outputs are int32.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import _C  # noqa: F401  (loads the TORCH_LIBRARY registrations)
from ._checks import (
    SKINNY_TILE,
    check_beam_topk,
    check_build_trie,
    check_kv_compact,
    check_kv_compact_paged,
    check_sampling_args,
    check_skinny_linear,
    check_tree_mask,
    check_verify_greedy,
    check_verify_sample,
)
from ._shape_checks import OPS, num_nodes_max

# the registered ops: each has a CPU and a CUDA kernel (tests/test_build.py checks both)
NATIVE_OPS = (*OPS, "kv_compact_paged")
# registered with a CPU kernel only (on a GPU a GEMM library already does this well)
CPU_OPS = ("skinny_linear",)

__all__ = [*NATIVE_OPS, *CPU_OPS, "NATIVE_OPS", "CPU_OPS", "skinny_pack"]


def tree_mask(node_parent: Tensor, num_nodes: Tensor, packed: bool = False) -> Tensor:
    """Ancestor-or-self mask of the trie (native kernel).

    Parameters
    ----------
    node_parent : Tensor
        ``(B, N)`` int32/int64, parent of each node, -1 for the root and padding; parents precede
        their children.
    num_nodes : Tensor
        ``(B,)`` int32/int64, valid nodes per row; rows ``>= num_nodes`` are padding and see only
        themselves.
    packed : bool
        Return int32 bit words instead of bools.

    Returns
    -------
    Tensor
        bool ``(B, N, N)``, ``mask[b, i, j]`` true when node j is an ancestor-or-self of node i; or,
        when ``packed``, int32 ``(B, N, ceil(N/32))`` with bit ``j % 32`` of word ``j // 32`` set,
        least significant bit first.

    Examples
    --------
    >>> parent = torch.tensor([[-1, 0, 1, 0]]); n = torch.tensor([4])
    >>> tree_mask(parent, n).int()[0]
    tensor([[1, 0, 0, 0],
            [1, 1, 0, 0],
            [1, 1, 1, 0],
            [1, 0, 0, 1]], dtype=torch.int32)
    >>> tree_mask(parent, n, packed=True)[0, :, 0]
    tensor([1, 3, 7, 9], dtype=torch.int32)
    """
    return torch.ops.redrafter.tree_mask(node_parent, num_nodes, packed)


@torch.library.register_fake("redrafter::tree_mask")
def _tree_mask_fake(node_parent: Tensor, num_nodes: Tensor, packed: bool = False) -> Tensor:
    # shapes depend only on (B, N), so tracing needs no values
    check_tree_mask(node_parent, num_nodes)
    B, N = node_parent.shape
    if packed:
        return node_parent.new_empty((B, N, (N + 31) // 32), dtype=torch.int32)
    return node_parent.new_empty((B, N, N), dtype=torch.bool)


def beam_topk(logits: Tensor, scores: Tensor, tokens: Tensor, state: Tensor, step: int) -> tuple[Tensor, ...]:
    """One fused beam-search step: log-softmax, running score, top-W over W*V, reorder by parent.

    Parameters
    ----------
    logits : Tensor
        ``(B, W, V)`` float32/float16/bfloat16 drafter logits of each beam.
    scores : Tensor
        ``(B, W)`` float32 running joint log-probabilities; ``[0, -inf, ...]`` at ``step == 1`` so
        that only beam 0 expands.
    tokens : Tensor
        ``(B, W, L)`` int32/int64 token history; positions ``< step`` must be token ids >= 0.
    state : Tensor
        ``(B, W, D)`` float32/float16/bfloat16 drafter state of each beam after this step.
    step : int
        Position ``1 <= step < L`` written by this step.

    Returns
    -------
    scores : Tensor
        ``(B, W)`` float32: ``scores[b, parent] + log_softmax(logits[b, parent])[token]``, sorted
        descending, ties to the lower flat index ``parent * V + token``.
    tokens : Tensor
        ``(B, W, L)`` int32: the parent's whole token row, position ``step`` set to the new token.
    state : Tensor
        ``(B, W, D)``, dtype of ``state``: the parent's state row.
    parent : Tensor
        ``(B, W)`` int32 parent beam of each new beam.

    Examples
    --------
    >>> logits = torch.tensor([[[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]]])   # B=1, W=2, V=3
    >>> scores = torch.tensor([[0.0, float("-inf")]])
    >>> tokens = torch.tensor([[[7, 0, 0], [7, 0, 0]]], dtype=torch.int32)
    >>> s, t, st, p = beam_topk(logits, scores, tokens, torch.zeros(1, 2, 4), step=1)
    >>> t[0].tolist(), p[0].tolist()
    ([[7, 1, 0], [7, 2, 0]], [0, 0])
    """
    return torch.ops.redrafter.beam_topk(logits, scores, tokens, state, step)


@torch.library.register_fake("redrafter::beam_topk")
def _beam_topk_fake(logits: Tensor, scores: Tensor, tokens: Tensor, state: Tensor, step: int) -> tuple[Tensor, ...]:
    # outputs have the input shapes; values (and so the parent choice) are not needed to trace
    check_beam_topk(logits, scores, tokens, state, step)
    B, W, _ = logits.shape
    return (
        logits.new_empty((B, W), dtype=torch.float32),
        tokens.new_empty(tokens.shape, dtype=torch.int32),
        state.new_empty(state.shape),
        logits.new_empty((B, W), dtype=torch.int32),
    )


def build_trie(beams: Tensor) -> tuple[Tensor, ...]:
    """Merge the beams' shared prefixes into a trie (Dynamic Tree Attention).

    Position 0 of every beam is the root (node 0, the guaranteed token taken from beam 0). Nodes are
    numbered in order of first occurrence, beam-major then depth, so parents precede children.

    Parameters
    ----------
    beams : Tensor
        ``(B, W, L)`` int32/int64 token ids (>= 0).

    Returns
    -------
    node_token, node_parent, node_depth : Tensor
        ``(B, N)`` int32 with ``N = 1 + W*(L-1)``; padding nodes have token 0, parent -1, depth 0,
        and the root has parent -1.
    beam_node : Tensor
        ``(B, W, L)`` int32 node of each beam position.
    num_nodes : Tensor
        ``(B,)`` int32 valid nodes per row.

    Examples
    --------
    >>> beams = torch.tensor([[[5, 1, 2], [5, 1, 3], [5, 4, 2]]])
    >>> token, parent, depth, beam_node, n = build_trie(beams)
    >>> token[0].tolist(), parent[0].tolist(), n.tolist()
    ([5, 1, 2, 3, 4, 2, 0], [-1, 0, 1, 1, 0, 4, -1], [6])
    >>> beam_node[0].tolist()
    [[0, 1, 2], [0, 1, 3], [0, 4, 5]]
    """
    return torch.ops.redrafter.build_trie(beams)


@torch.library.register_fake("redrafter::build_trie")
def _build_trie_fake(beams: Tensor) -> tuple[Tensor, ...]:
    # fixed shapes: N = 1 + W*(L-1) nodes whatever the sharing (num_nodes says how many are used)
    check_build_trie(beams)
    B, W, L = beams.shape
    N = num_nodes_max(W, L)
    return (
        beams.new_empty((B, N), dtype=torch.int32),
        beams.new_empty((B, N), dtype=torch.int32),
        beams.new_empty((B, N), dtype=torch.int32),
        beams.new_empty((B, W, L), dtype=torch.int32),
        beams.new_empty((B,), dtype=torch.int32),
    )


def verify_greedy(logits: Tensor, beams: Tensor, beam_node: Tensor) -> tuple[Tensor, ...]:
    """Greedy acceptance: the longest beam whose draft tokens equal the target's argmax.

    Along beam w the accepted length is the number of leading draft tokens ``beams[b, w, d+1]``
    equal to the argmax of ``logits[b, beam_node[b, w, d]]`` (first maximum on ties, like
    ``torch.argmax``). Only the nodes a beam reaches are reduced over V.

    Parameters
    ----------
    logits : Tensor
        ``(B, N', V)`` float32/float16/bfloat16 target logits at each trie node,
        ``N' >= 1 + W*(L-1)``.
    beams : Tensor
        ``(B, W, L)`` int32/int64 draft beams (position 0 is the guaranteed token).
    beam_node : Tensor
        ``(B, W, L)`` int32/int64 node of each beam position (from ``build_trie``), in ``[0, N')``.

    Returns
    -------
    accept_len : Tensor
        ``(B,)`` int32 accepted draft tokens, ``0..L-1``.
    best_beam : Tensor
        ``(B,)`` int32 beam achieving it (ties to the lowest beam).
    path_nodes : Tensor
        ``(B, L)`` int32 nodes of the accepted path, root first, -1 past ``accept_len``.
    next_token : Tensor
        ``(B,)`` int32 target argmax at the last accepted node.

    Examples
    --------
    >>> beams = torch.tensor([[[5, 1, 2], [5, 1, 3]]])
    >>> beam_node = torch.tensor([[[0, 1, 2], [0, 1, 3]]])
    >>> logits = torch.zeros(1, 5, 6); logits[0, 0, 1] = 1; logits[0, 1, 3] = 1; logits[0, 3, 4] = 1
    >>> [x.tolist() for x in verify_greedy(logits, beams, beam_node)]
    [[2], [1], [[0, 1, 3]], [4]]
    """
    return torch.ops.redrafter.verify_greedy(logits, beams, beam_node)


def _verify_outputs_fake(logits: Tensor, beams: Tensor) -> tuple[Tensor, ...]:
    """Both verify ops return accept_len (B,), best_beam (B,), path_nodes (B, L), next_token (B,) int32."""
    B, _, L = beams.shape
    return (
        logits.new_empty((B,), dtype=torch.int32),
        logits.new_empty((B,), dtype=torch.int32),
        logits.new_empty((B, L), dtype=torch.int32),
        logits.new_empty((B,), dtype=torch.int32),
    )


@torch.library.register_fake("redrafter::verify_greedy")
def _verify_greedy_fake(logits: Tensor, beams: Tensor, beam_node: Tensor) -> tuple[Tensor, ...]:
    check_verify_greedy(logits, beams, beam_node)
    return _verify_outputs_fake(logits, beams)


def verify_sample(
    logits: Tensor, beams: Tensor, beam_node: Tensor, accept_u: Tensor, sample_u: Tensor, temperature: float,
    top_k: int = 0, top_p: float = 1.0,
) -> tuple[Tensor, ...]:
    """Exact sampling: recursive rejection over the trie (native kernels, CPU and CUDA).

    ``p`` is the target's distribution at a node after temperature, top-k and top-p
    (``sampling.sampling_probs``, float64). From the root, the node's distinct children are tried
    in beam order (a child ranks by the lowest beam through it); the j-th tried, token ``t``, is
    accepted when ``accept_u[b, depth, j] * mass < p(t)``, ``mass`` the sum of the not yet rejected
    ``p``; on rejection ``p(t) = 0``. The walk continues at an accepted child; when every child is
    rejected (or at depth L-1) the next token is drawn from the remaining ``p`` by inverse CDF
    with ``sample_u[b]``. With i.i.d. U[0, 1) uniforms the committed tokens follow the target's
    distribution exactly. Decisions equal ``reference.verify_sample``'s given the same uniforms.
    ``temperature == 0`` is ``verify_greedy`` exactly. Only the nodes the walk reaches are reduced
    over V.

    On CUDA the sums are block reductions (float64, deterministic) instead of the reference's
    index-order sequential sums, so a decision can differ from the reference's only when a uniform
    lies within ~1e-15 (relative) of its threshold; values are not checked on the host there (no
    synchronisation): out-of-range ids are rejected by the kernel (docs/verify_sample_cuda_notes.md).

    Parameters
    ----------
    logits : Tensor
        ``(B, N', V)`` float32/float16/bfloat16 target logits at each trie node, ``N' >= 1 + W*(L-1)``.
    beams : Tensor
        ``(B, W, L)`` int32/int64 draft beams; position 0 the guaranteed token, draft tokens in
        ``[0, V)``.
    beam_node : Tensor
        ``(B, W, L)`` int32/int64 node of each beam position (from ``build_trie``), in ``[0, N')``.
    accept_u : Tensor
        ``(B, L-1, W)`` float32 uniforms in ``[0, 1)``: ``accept_u[b, d, j]`` decides the j-th
        distinct child tried at depth ``d``.
    sample_u : Tensor
        ``(B,)`` float32 uniform in ``[0, 1)`` for the next token.
    temperature : float
        ``>= 0``; 0 is greedy.
    top_k : int
        ``>= 0``; 0 is off.
    top_p : float
        In ``(0, 1]``; 1 is off.

    Returns
    -------
    accept_len, best_beam, path_nodes, next_token : Tensor
        As ``verify_greedy`` (all int32): accepted drafts ``(B,)``, the lowest beam containing the
        accepted path ``(B,)``, its nodes ``(B, L)`` root first (-1 past ``accept_len``), and the
        token sampled at the stop node ``(B,)``.

    Examples
    --------
    >>> beams = torch.tensor([[[5, 1, 2], [5, 3, 0]]])
    >>> beam_node = torch.tensor([[[0, 1, 2], [0, 3, 4]]])
    >>> logits = torch.zeros(1, 5, 4); logits[0, 0, 3] = 9.0   # the root almost surely says 3
    >>> au = torch.tensor([[[0.5, 0.5], [0.1, 0.5]]]); su = torch.tensor([0.5])
    >>> a, w, path, nxt = verify_sample(logits, beams, beam_node, au, su, temperature=1.0)
    >>> a.tolist(), w.tolist(), path.tolist()   # 1 rejected, 3 accepted, then 0 (p = 1/4) accepted
    ([2], [1], [[0, 3, 4]])
    """
    # the schema would round top_k=2.5 to 2 and take True as 1: the reference's rule, before the cast
    check_sampling_args("verify_sample", temperature, top_k, top_p)
    return torch.ops.redrafter.verify_sample(
        logits, beams, beam_node, accept_u, sample_u, float(temperature), int(top_k), float(top_p)
    )


@torch.library.register_fake("redrafter::verify_sample")
def _verify_sample_fake(
    logits: Tensor, beams: Tensor, beam_node: Tensor, accept_u: Tensor, sample_u: Tensor,
    temperature: float, top_k: int = 0, top_p: float = 1.0,
) -> tuple[Tensor, ...]:
    check_verify_sample(logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p)
    return _verify_outputs_fake(logits, beams)


def kv_compact(kv: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor) -> None:
    """Keep only the accepted path's K/V, in place, and advance ``cache_len``.

    For each row b and ``i = 0..accept_len[b]``, slot ``cache_len[b] + path_nodes[b, i]`` is copied
    to slot ``cache_len[b] + i`` in every layer, K and V; then ``cache_len[b] += accept_len[b] + 1``.
    ``accept_len[b] == -1`` marks an inactive row: nothing is copied or advanced. All values are
    checked before anything is written: on error ``kv`` and ``cache_len`` are unchanged.

    Parameters
    ----------
    kv : Tensor
        ``(n_layers, 2, B, H_kv, S, D)`` contiguous float32/float16/bfloat16 cache (modified).
    cache_len : Tensor
        ``(B,)`` int32 tokens already committed per row, in ``[0, S]`` (modified).
    path_nodes : Tensor
        ``(B, L)`` int32/int64 accepted path from ``verify_greedy``: ``path_nodes[b, i] >= i`` and
        ``cache_len[b] + path_nodes[b, i] < S`` for ``i <= accept_len[b]``; ignored past it.
    accept_len : Tensor
        ``(B,)`` int32/int64 in ``[-1, L-1]``.

    Examples
    --------
    >>> kv = torch.arange(6.0).reshape(1, 1, 1, 1, 6, 1).expand(1, 2, 1, 1, 6, 1).contiguous()
    >>> cache_len = torch.tensor([1], dtype=torch.int32)
    >>> kv_compact(kv, cache_len, torch.tensor([[0, 2, 4]]), torch.tensor([2]))
    >>> kv[0, 0, 0, 0, :, 0].tolist(), cache_len.tolist()
    ([0.0, 1.0, 3.0, 5.0, 4.0, 5.0], [4])
    """
    torch.ops.redrafter.kv_compact(kv, cache_len, path_nodes, accept_len)


@torch.library.register_fake("redrafter::kv_compact")
def _kv_compact_fake(kv: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor) -> None:
    # in place, no outputs: only the metadata checks
    check_kv_compact(kv, cache_len, path_nodes, accept_len)


def kv_compact_paged(
    kv_pages: Tensor, block_table: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor
) -> None:
    """``kv_compact`` on a paged (vLLM-style) cache, in place, every layer in one call.

    Logical slot s of row b lives in physical block ``block_table[b, s // block_size]`` at offset
    ``s % block_size``. For each row b and ``i = 0..accept_len[b]``, logical slot
    ``cache_len[b] + path_nodes[b, i]`` is copied to logical slot ``cache_len[b] + i`` in every
    layer, K and V; then ``cache_len[b] += accept_len[b] + 1``. ``accept_len[b] == -1`` marks an
    inactive row: nothing is read, copied or advanced. The CPU kernel checks every value before
    anything is written (on error ``kv_pages`` and ``cache_len`` are unchanged); the CUDA kernel
    reads no value on the host and leaves a row with out-of-range values untouched.

    Parameters
    ----------
    kv_pages : Tensor
        ``(n_layers, num_blocks, 2, H_kv, block_size, D)`` contiguous float32/float16/bfloat16
        pages, layers stacked (modified).
    block_table : Tensor
        ``(B, max_blocks)`` int32; each row holds ``S = max_blocks * block_size`` logical slots. The
        blocks of the slots a step reads or writes must be ids in ``[0, num_blocks)`` belonging to
        one (row, logical block) each (checked on the CPU; the caller's contract on CUDA).
    cache_len, path_nodes, accept_len : Tensor
        As in ``kv_compact``, with ``S`` the logical length.

    Examples
    --------
    >>> pages = torch.arange(8.0).reshape(1, 4, 1, 1, 2, 1).expand(1, 4, 2, 1, 2, 1).contiguous()
    >>> table = torch.tensor([[3, 1]], dtype=torch.int32)  # logical slots 0..3 = blocks 3, 1
    >>> cache_len = torch.tensor([0], dtype=torch.int32)
    >>> kv_compact_paged(pages, table, cache_len, torch.tensor([[0, 2]]), torch.tensor([1]))  # 2 -> 1
    >>> pages[0, :, 0, 0, :, 0].tolist(), cache_len.tolist()
    ([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 2.0]], [2])
    """
    torch.ops.redrafter.kv_compact_paged(kv_pages, block_table, cache_len, path_nodes, accept_len)


@torch.library.register_fake("redrafter::kv_compact_paged")
def _kv_compact_paged_fake(
    kv_pages: Tensor, block_table: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor
) -> None:
    # in place, no outputs: only the metadata checks
    check_kv_compact_paged(kv_pages, block_table, cache_len, path_nodes, accept_len)


def skinny_pack(weight: Tensor) -> Tensor:
    """Pack a linear layer's weight for ``skinny_linear`` (pure PyTorch, any device).

    Every 4 output rows x 16 inputs form one contiguous 256-byte tile, so a product with a few rows
    of x reads the weight as one sequential stream. The layout is the one ``skinny_linear`` and
    ``reference.skinny_linear`` take; a production helper, hence here and not in the reference.

    Args:
        weight: ``(N, K)`` float32.

    Returns:
        ``(ceil(N/4), ceil(K/16), 4, 16)`` float32, zero-padded: ``packed[t, j, r, i] =
        weight[4t + r, 16j + i]``.
    """
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise ValueError(f"skinny_pack: weight must be a 2-D (N, K) tensor, got "
                         f"{tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__}")
    if weight.dtype != torch.float32:
        raise TypeError(f"skinny_pack: weight must be float32, got {weight.dtype}")
    N, K = weight.shape
    nr, kb = SKINNY_TILE
    Np, Kp = -(-N // nr) * nr, -(-K // kb) * kb
    w = torch.nn.functional.pad(weight.detach(), (0, Kp - K, 0, Np - N))
    return w.view(Np // nr, nr, Kp // kb, kb).permute(0, 2, 1, 3).contiguous()


def skinny_linear(x: Tensor, packed: Tensor, out_features: int, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T (+ bias)`` for a few rows of x, over ``packed = skinny_pack(weight)``
    (native CPU kernel).

    A decode step or tree verify multiplies a handful of rows by each weight: the product is bound
    by reading the weight, which this kernel streams once whatever the number of rows (a GEMM
    repacks it per call, a GEMV reads it once per row). Each output is summed in a fixed order, so
    a row's result does not depend on the other rows of the call. Float32 on the CPU only.

    Parameters
    ----------
    x : Tensor
        ``(M, K)`` float32 (CPU).
    packed : Tensor
        ``(ceil(N/4), ceil(K/16), 4, 16)`` float32: the ``(N, K)`` weight in 4 x 16 tiles, zero-padded.
    out_features : int
        N, the weight's rows.
    bias : Tensor, optional
        ``(N,)`` float32.

    Returns
    -------
    Tensor
        ``(M, N)`` float32.

    Examples
    --------
    >>> w = torch.arange(6.0).reshape(3, 2); x = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    >>> skinny_linear(x, skinny_pack(w), 3)
    tensor([[ 1.,  5.,  9.],
            [-1., -1., -1.]])
    """
    check_skinny_linear(x, packed, out_features, bias)
    if x.device.type != "cpu":
        raise ValueError(f"skinny_linear: x must be a CPU tensor (this op has only a CPU kernel), got {x.device}")
    return torch.ops.redrafter.skinny_linear(x, packed, out_features, bias)


@torch.library.register_fake("redrafter::skinny_linear")
def _skinny_linear_fake(x: Tensor, packed: Tensor, out_features: int, bias: Tensor | None = None) -> Tensor:
    check_skinny_linear(x, packed, out_features, bias)
    return x.new_empty((x.shape[0], out_features))
