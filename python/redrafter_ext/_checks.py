"""Input validation shared by the reference ops and the native-op wrappers (torch).

Every check reads only metadata (rank, shape, dtype, device), never tensor values, so it costs no
host synchronisation. Errors name the argument and say what was expected. The checks themselves
are framework-agnostic (``_shape_checks``, shared with the MLX ops); this module binds them to torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ._scalar_checks import check_int
from ._shape_checks import ArrayChecks

INT_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

_TORCH = ArrayChecks(
    Tensor, "a torch.Tensor", "torch.", INT_DTYPES, FLOAT_DTYPES, torch.float32, torch.int32,
    device_of=lambda t: t.device, is_contiguous=lambda t: t.is_contiguous(),
)


def check_tensor(
    op: str,
    name: str,
    t: object,
    dims: str,
    dtypes: Sequence[torch.dtype] | None = None,
    device: torch.device | None = None,
) -> Tensor:
    """Check type, rank (len(dims.split(','))), dtype and device of one argument.

    ``dims`` documents the expected shape in the message, e.g. ``"B, W, L"``.
    """
    return _TORCH.array(op, name, t, dims, dtypes, device)


def check_beam_topk(logits: Tensor, scores: Tensor, tokens: Tensor, state: Tensor, step: int) -> None:
    _TORCH.beam_topk(logits, scores, tokens, state, step)


def check_build_trie(beams: Tensor) -> None:
    _TORCH.build_trie(beams)


def check_ngram_lookup(tokens: Tensor, length: Tensor, max_n: int, m: int) -> None:
    _TORCH.ngram_lookup(tokens, length, max_n, m)


def check_tree_mask(node_parent: Tensor, num_nodes: Tensor) -> None:
    _TORCH.tree_mask(node_parent, num_nodes)


def check_verify_greedy(logits: Tensor, beams: Tensor, beam_node: Tensor) -> None:
    _TORCH.verify("verify_greedy", logits, beams, beam_node)


def check_kv_compact(kv: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor) -> None:
    _TORCH.kv_compact(kv, cache_len, path_nodes, accept_len)


def check_kv_compact_paged(
    kv_pages: Tensor, block_table: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor
) -> None:
    _TORCH.kv_compact_paged(kv_pages, block_table, cache_len, path_nodes, accept_len)


def check_verify_sample(
    logits: Tensor, beams: Tensor, beam_node: Tensor, accept_u: Tensor, sample_u: Tensor,
    temperature: float, top_k: int, top_p: float,
) -> None:
    # the torch checks have always reported the verify_greedy part under that op's name
    _TORCH.verify_sample(
        logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p, verify_op="verify_greedy"
    )


def check_sampling_args(op: str, temperature: float, top_k: int, top_p: float) -> None:
    """temperature finite >= 0, top_k an int >= 0, top_p in (0, 1]; bools and 2.5-style top_k rejected."""
    _TORCH.sampling_args(op, temperature, top_k, top_p)


SKINNY_TILE = (4, 16)  # (output rows, inputs) of one packed tile of skinny_linear's weight


def check_skinny_linear(x: Tensor, packed: Tensor, out_features: int, bias: Tensor | None) -> None:
    """x (M, K) float32; packed (ceil(N/4), ceil(K/16), 4, 16) float32 on x's device; bias None or (N,)."""
    op = "skinny_linear"
    check_tensor(op, "x", x, "M, K", (torch.float32,))
    check_tensor(op, "packed", packed, "ceil(N/4), ceil(K/16), 4, 16", (torch.float32,), x.device)
    check_int(op, "out_features", out_features, 0)
    nr, kb = SKINNY_TILE
    want = (-(-out_features // nr), -(-x.shape[1] // kb), nr, kb)
    if tuple(packed.shape) != want:
        raise ValueError(f"{op}: packed must have shape (ceil(out_features/4), ceil(K/16), 4, 16) = {want} for "
                         f"out_features={out_features} and x's K={x.shape[1]}, got {tuple(packed.shape)}")
    if bias is not None:
        check_tensor(op, "bias", bias, "N", (torch.float32,), x.device)
        if bias.shape[0] != out_features:
            raise ValueError(f"{op}: bias must have shape (out_features,) = ({out_features},), got {tuple(bias.shape)}")
