"""Native ops (namespace ``torch.ops.redrafter``): thin wrappers with the reference's signatures.

Each op's contract (semantics, shapes, dtypes) is that of the same-named function of
``redrafter_ext.reference``, written there once; the docstrings here say what is specific to the
native kernels. Each wrapper calls the registered C++/CUDA kernel (every op has both, listed in
``NATIVE_OPS``); a fake (meta) kernel registered here gives output shapes to ``torch.compile`` and
FakeTensor tracing without running anything.

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
    check_ngram_lookup,
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
    """Ancestor-or-self mask of the trie (native kernel): ``reference.tree_mask``'s contract.

    Examples:
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
    """One fused beam-search step (native kernel): ``reference.beam_topk``'s contract.

    Examples:
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
    """Merge the beams' shared prefixes into a trie (native kernel): ``reference.build_trie``'s contract.

    Examples:
        >>> beams = torch.tensor([[[5, 1, 2], [5, 1, 3], [5, 4, 2]]])
        >>> token, parent, depth, beam_node, n = build_trie(beams)
        >>> token[0].tolist(), parent[0].tolist(), n.tolist()
        ([5, 1, 2, 3, 4, 2, 0], [-1, 0, 1, 1, 0, 4, -1], [6])
        >>> beam_node[0].tolist()
        [[0, 1, 2], [0, 1, 3], [0, 4, 5]]
    """
    return torch.ops.redrafter.build_trie(beams)


def ngram_lookup(tokens: Tensor, length: Tensor, max_n: int, m: int) -> Tensor:
    """Prompt-lookup drafts (native kernel): ``reference.ngram_lookup``'s contract. The CPU kernel
    raises on a ``length`` outside ``[0, S]``; the CUDA kernel, which reads no value on the host,
    clamps it into that range.

    Examples:
        >>> tokens = torch.tensor([[4, 5, 6, 7, 4, 5, 0], [1, 2, 1, 2, 0, 0, 0]])
        >>> ngram_lookup(tokens, torch.tensor([6, 4]), max_n=2, m=3).tolist()
        [[6, 7, 4], [1, 2, 1]]
    """
    return torch.ops.redrafter.ngram_lookup(tokens, length, max_n, m)


@torch.library.register_fake("redrafter::ngram_lookup")
def _ngram_lookup_fake(tokens: Tensor, length: Tensor, max_n: int, m: int) -> Tensor:
    check_ngram_lookup(tokens, length, max_n, m)
    return tokens.new_empty((tokens.shape[0], m), dtype=torch.int32)


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
    """Greedy acceptance (native kernel): ``reference.verify_greedy``'s contract.

    Only the nodes a beam reaches are reduced over V.

    Examples:
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
    """Exact sampling over the trie (native kernels, CPU and CUDA): ``reference.verify_sample``'s decisions.

    The reference's contract, and its decisions given the same uniforms (up to the CUDA note below).

    Only the nodes the walk reaches are reduced over V. On CUDA the sums are block reductions (float64,
    deterministic) instead of the reference's index-order sequential sums, so a decision can differ
    from the reference's only when a uniform lies within ~1e-15 (relative) of its threshold; values
    are not checked on the host there (no synchronisation): out-of-range ids are rejected by the
    kernel (docs/verify_sample_cuda_notes.md).

    Examples:
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
    """Keep only the accepted path's K/V, in place (native kernel): ``reference.kv_compact``'s contract.

    All values are checked before anything is written: on error ``kv`` and ``cache_len`` are
    unchanged.

    Examples:
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
    """``kv_compact`` on a paged cache, in place (native kernel): ``reference.kv_compact_paged``'s contract.

    The CPU kernel checks every value before anything is written (on error ``kv_pages`` and
    ``cache_len`` are unchanged), the block-table rule included; the CUDA kernel reads no value on the
    host and leaves a row with out-of-range values untouched, and there the block-table rule (no block
    shared between (row, logical block) pairs) is the caller's to keep.

    Examples:
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
    """``x @ weight.T (+ bias)`` for a few rows of x (native CPU kernel): ``reference.skinny_linear``.

    Over ``packed = skinny_pack(weight)``; float32 on the CPU only.

    A decode step or tree verify multiplies a handful of rows by each weight: the product is bound
    by reading the weight, which this kernel streams once whatever the number of rows (a GEMM
    repacks it per call, a GEMV reads it once per row). Each output is summed in a fixed order, so
    a row's result does not depend on the other rows of the call.

    Examples:
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
