"""Metadata checks of the MLX ops, shared by the native wrappers (``ops``) and the reference.

The checks are framework-agnostic (``redrafter_ext._shape_checks``, shared with the torch ops);
this module binds them to ``mlx.core``. MLX arrays have no device to match (streams pick it).
"""

from __future__ import annotations

import mlx.core as mx

from .._shape_checks import ArrayChecks

INT_DTYPES = (mx.int32, mx.int64)
FLOAT_DTYPES = (mx.float32, mx.float16, mx.bfloat16)

_MLX = ArrayChecks(mx.array, "an mlx.core.array", "mlx.core.", INT_DTYPES, FLOAT_DTYPES, mx.float32, mx.int32)

check_array = _MLX.array
check_beam_topk = _MLX.beam_topk
check_build_trie = _MLX.build_trie
check_ngram_lookup = _MLX.ngram_lookup
check_tree_mask = _MLX.tree_mask
check_kv_compact = _MLX.kv_compact


def check_verify_greedy(logits: mx.array, beams: mx.array, beam_node: mx.array) -> None:
    _MLX.verify("verify_greedy", logits, beams, beam_node)


def check_verify_sample(
    logits: mx.array, beams: mx.array, beam_node: mx.array, accept_u: mx.array, sample_u: mx.array,
    temperature: float, top_k: int, top_p: float,
) -> None:
    _MLX.verify_sample(logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p)
