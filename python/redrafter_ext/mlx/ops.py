"""ReDrafter ops for MLX: native primitives (``redrafter_ext.mlx._ext``) with the reference's semantics.

Same names, arguments and results as ``redrafter_ext.ops`` / ``redrafter_ext.reference``, on
``mlx.core.array``: each op's contract (semantics, shapes, dtypes) is written once, in
``redrafter_ext.reference``; the docstrings here say what differs on MLX. Every op also takes
``stream=`` (an ``mx.Stream`` or ``mx.Device``; None: the default stream).

Each op adds one node to MLX's lazy graph (one ``Primitive``): nothing runs until the result is
evaluated, so the ops compose with other MLX ops and ``mx.compile``. On the CPU stream the node
runs the project's C++ CPU kernels (the torch extension's) as an asynchronous task; on the GPU
stream (macOS) the Metal kernels. No autodiff (``grad``/``jvp``/``vjp``) or ``vmap``: they raise.

Checks: every wrapper checks types, ranks, shapes and dtypes here and raises ``TypeError`` /
``ValueError`` naming the argument, before anything is built. Integer inputs may be int32 or int64;
they are cast to int32 (values are then taken modulo 2^32, like a C cast), and integer outputs are
int32. *Values* cannot be checked without evaluating the inputs (which would break laziness), so
the kernels guard them instead: node ids, draft tokens and ``ngram_lookup``'s lengths are clamped
into range, an invalid parent makes a node a root, and a ``kv_compact`` row with invalid lengths or
path is left untouched. No value can make an op read or write out of bounds; the results for
invalid values are unspecified (the torch ops raise on them instead).

``kv_compact`` is functional (it returns the new ``kv`` and ``cache_len``) but works in place when
MLX can donate the input buffers: write ``kv, cache_len = kv_compact(kv, cache_len, ...)`` and
keep no other reference to the old arrays; otherwise it copies the cache first.
"""

from __future__ import annotations

import mlx.core as mx

from .._shape_checks import OPS
from . import _checks, _ext

__all__ = [*OPS, "HAS_METAL"]

#: whether this build has the Metal (GPU) kernels; without them, ops on a GPU stream raise at eval
HAS_METAL: bool = bool(_ext.has_metal)


def _check_abi() -> None:
    # nanobind converts mlx.core.array only when _ext shares mlx.core's nanobind ABI; otherwise every
    # call fails with a puzzling "incompatible function arguments". Building one node evaluates nothing.
    try:
        _ext.tree_mask(mx.zeros((1, 1), dtype=mx.int32), mx.zeros((1,), dtype=mx.int32))
    except TypeError as e:
        raise ImportError(
            "redrafter_ext.mlx._ext cannot exchange arrays with mlx.core: it was built with a nanobind "
            f"whose ABI differs from mlx {mx.__version__}'s (rebuild with the nanobind version mlx uses): {e}"
        ) from e


_check_abi()

Stream = mx.Stream | mx.Device | None


def _i32(a: mx.array) -> mx.array:
    return a if a.dtype == mx.int32 else a.astype(mx.int32)


def beam_topk(
    logits: mx.array, scores: mx.array, tokens: mx.array, state: mx.array, step: int, *, stream: Stream = None
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """One fused beam-search step (MLX primitive): ``redrafter_ext.reference.beam_topk``'s contract.

    Examples:
        >>> logits = mx.array([[[0.0, 2.0, 1.0], [5.0, 0.0, 0.0]]])
        >>> scores = mx.array([[0.0, float("-inf")]])
        >>> tokens = mx.array([[[7, 0, 0], [7, 0, 0]]])
        >>> s, t, st, p = beam_topk(logits, scores, tokens, mx.zeros((1, 2, 4)), step=1)
        >>> t[0].tolist(), p[0].tolist()
        ([[7, 1, 0], [7, 2, 0]], [0, 0])
    """
    _checks.check_beam_topk(logits, scores, tokens, state, step)
    return tuple(_ext.beam_topk(logits, scores, _i32(tokens), state, step, stream=stream))


def build_trie(beams: mx.array, *, stream: Stream = None) -> tuple[mx.array, ...]:
    """Merge the beams' shared prefixes into a trie (MLX primitive): ``redrafter_ext.reference.build_trie``.

    Examples:
        >>> token, parent, depth, beam_node, n = build_trie(mx.array([[[5, 1, 2], [5, 1, 3], [5, 4, 2]]]))
        >>> token[0].tolist(), parent[0].tolist(), n.tolist()
        ([5, 1, 2, 3, 4, 2, 0], [-1, 0, 1, 1, 0, 4, -1], [6])
    """
    _checks.check_build_trie(beams)
    return tuple(_ext.build_trie(_i32(beams), stream=stream))


def ngram_lookup(tokens: mx.array, length: mx.array, max_n: int, m: int, *, stream: Stream = None) -> mx.array:
    """Prompt-lookup drafts (MLX primitive): ``redrafter_ext.reference.ngram_lookup``'s contract.

    A ``length`` outside ``[0, S]`` is clamped into it instead of raising. int64 tokens are cast
    to int32 like every integer input (ids outside int32 wrap and may then compare equal).

    Examples:
        >>> tokens = mx.array([[4, 5, 6, 7, 4, 5, 0], [1, 2, 1, 2, 0, 0, 0]])
        >>> ngram_lookup(tokens, mx.array([6, 4]), max_n=2, m=3).tolist()
        [[6, 7, 4], [1, 2, 1]]
    """
    _checks.check_ngram_lookup(tokens, length, max_n, m)
    return _ext.ngram_lookup(_i32(tokens), _i32(length), max_n, m, stream=stream)


def tree_mask(node_parent: mx.array, num_nodes: mx.array, packed: bool = False, *, stream: Stream = None) -> mx.array:
    """Ancestor-or-self mask of the trie (MLX primitive): ``redrafter_ext.reference.tree_mask``'s contract.

    Out-of-contract values do not raise: a parent outside ``[-1, i)`` at node ``i`` makes it a root
    (it sees only itself), and ``num_nodes`` is clamped into ``[0, N]``.

    Examples:
        >>> tree_mask(mx.array([[-1, 0, 1, 0]]), mx.array([4]), packed=True)[0, :, 0].tolist()
        [1, 3, 7, 9]
    """
    _checks.check_tree_mask(node_parent, num_nodes)
    return _ext.tree_mask(_i32(node_parent), _i32(num_nodes), bool(packed), stream=stream)


def verify_greedy(
    logits: mx.array, beams: mx.array, beam_node: mx.array, *, stream: Stream = None
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Greedy acceptance (MLX primitive): ``redrafter_ext.reference.verify_greedy``'s contract.

    ``beam_node`` values outside ``[0, N')`` are clamped into it instead of raising.

    Examples:
        >>> beams = mx.array([[[5, 1, 2], [5, 1, 3]]]); beam_node = mx.array([[[0, 1, 2], [0, 1, 3]]])
        >>> logits = mx.zeros((1, 5, 6)); logits[0, 0, 1] = 1; logits[0, 1, 3] = 1; logits[0, 3, 4] = 1
        >>> [x.tolist() for x in verify_greedy(logits, beams, beam_node)]
        [[2], [1], [[0, 1, 3]], [4]]
    """
    _checks.check_verify_greedy(logits, beams, beam_node)
    return tuple(_ext.verify_greedy(logits, _i32(beams), _i32(beam_node), stream=stream))


def verify_sample(
    logits: mx.array, beams: mx.array, beam_node: mx.array, accept_u: mx.array, sample_u: mx.array,
    temperature: float, top_k: int = 0, top_p: float = 1.0, *, stream: Stream = None,
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Exact sampling over the trie (MLX primitive): ``redrafter_ext.reference.verify_sample``'s decisions.

    Draft tokens and ``beam_node`` values out of range are clamped into it instead of raising.
    """
    _checks.check_verify_sample(logits, beams, beam_node, accept_u, sample_u, temperature, top_k, top_p)
    top_k = min(top_k, 2**31 - 1)  # >= V is "off" anyway
    return tuple(
        _ext.verify_sample(
            logits, _i32(beams), _i32(beam_node), accept_u, sample_u, float(temperature), top_k, float(top_p),
            stream=stream,
        )
    )


def kv_compact(
    kv: mx.array, cache_len: mx.array, path_nodes: mx.array, accept_len: mx.array, *, stream: Stream = None
) -> tuple[mx.array, mx.array]:
    """Keep only the accepted path's K/V (MLX primitive): ``redrafter_ext.reference.kv_compact``, functional.

    Returns the new ``(kv, cache_len)`` instead of writing in place.

    A row whose values are invalid (``accept_len`` outside ``[-1, L-1]``, ``cache_len`` outside
    ``[0, S]``, or for some ``i <= accept_len``: ``path_nodes[b, i] < i`` or ``cache_len[b] +
    path_nodes[b, i] >= S``) is treated as inactive instead of raising.

    In place in practice: when the old ``kv`` (and ``cache_len``) are referenced by nothing but
    this op at evaluation time, MLX donates their buffers and only the accepted slots move. Write
    ``kv, cache_len = kv_compact(kv, cache_len, ...)``. If the old arrays are still referenced, the
    op copies them first (correct, but a full pass over the cache).

    Returns:
        ``kv`` ``(n_layers, 2, B, H_kv, S, D)``, the compacted cache (``kv``'s dtype), and
        ``cache_len`` ``(B,)`` int32, the advanced lengths.

    Examples:
        >>> kv = mx.broadcast_to(mx.arange(6.0).reshape(1, 1, 1, 1, 6, 1), (1, 2, 1, 1, 6, 1))
        >>> kv, cache_len = kv_compact(kv, mx.array([1], dtype=mx.int32), mx.array([[0, 2, 4]]), mx.array([2]))
        >>> kv[0, 0, 0, 0, :, 0].tolist(), cache_len.tolist()
        ([0.0, 1.0, 3.0, 5.0, 4.0, 5.0], [4])
    """
    _checks.check_kv_compact(kv, cache_len, path_nodes, accept_len)
    return tuple(_ext.kv_compact(kv, cache_len, _i32(path_nodes), _i32(accept_len), stream=stream))
