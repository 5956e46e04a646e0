"""Metadata checks of every op, written once for torch and MLX (imports neither framework).

An ``ArrayChecks`` is told how one framework spells an array type, a dtype and a device; the op
checks on top of it (ranks, shape relations, scalar arguments, and their messages) serve the torch
wrappers and reference (``redrafter_ext._checks``) and the MLX ones (``redrafter_ext.mlx._checks``).
Nothing here reads array values, so no check costs a host synchronisation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ._scalar_checks import check_int, check_sampling

# The six ops every backend has (the torch one adds kv_compact_paged), in pipeline order.
OPS = ("beam_topk", "build_trie", "tree_mask", "verify_greedy", "verify_sample", "kv_compact", "ngram_lookup")

#: the largest key length and draft length ``ngram_lookup`` takes (the kernels keep them in int32)
NGRAM_MAX = 1 << 16
#: ``generate``'s and ``Batch``'s default lookup (docs/lookup.md): in the last beam's place it adds no
#: node, and it raised tokens/step at every shape measured and the speedup at 8 of 9
LOOKUP_DEFAULT = 2


def num_nodes_max(beam_width: int, beam_length: int) -> int:
    """N = 1 + W*(L-1): the most trie nodes W beams of length L can produce (the prompt-lookup beam
    takes the place of the last one, so it adds none)."""
    return 1 + beam_width * (beam_length - 1)


def menu_nodes_max(menu: Sequence[tuple[int, int]]) -> int:
    """The largest trie of a policy menu of (W, L): the cache room every step of it needs."""
    return max(num_nodes_max(w, n) for w, n in menu)


# -- value rules -----------------------------------------------------------------------------------
# Elementwise predicates on arrays of either framework (only comparison operators are used), shared by
# the torch reference (which asserts them on the device) and the MLX one (which sanitises instead, as
# its kernels do). The native torch ops check the same rules on the host (csrc/torch/ops_cpu.cpp).
TOKEN_MAX = 2**31 - 1


def token_ids_ok(tokens: Any) -> Any:
    """Token ids must lie in ``[0, 2^31)``."""
    return (tokens >= 0) & (tokens <= TOKEN_MAX)


def parents_ok(node_parent: Any, node: Any) -> Any:
    """Node ``i``'s parent must be -1 (a root) or a lower node index: no self-parent, no cycle."""
    return (node_parent >= -1) & (node_parent < node)


def nodes_ok(node_ids: Any, num_nodes: int) -> Any:
    """Node ids (``beam_node``) must index the ``num_nodes`` nodes of the logits."""
    return (node_ids >= 0) & (node_ids < num_nodes)


def common_batch(op: str, batches: dict[str, int]) -> int:
    """The batch size most of ``batches`` (field name -> its batch) agree on; blames the odd one out."""
    counts = list(batches.values())
    B = max(counts, key=counts.count)
    for name, b in batches.items():
        if b != B:
            raise ValueError(f"{op}: {name} has batch {b} but the other fields have B = {B} rows")
    return B


class ArrayChecks:
    """Argument checks for one array framework.

    Args:
        array_type: the framework's array class (``torch.Tensor``, ``mlx.core.array``).
        array_label: how messages name it, with its article (``"a torch.Tensor"``).
        dtype_prefix: stripped from dtype names in messages (``"torch."``).
        int_dtypes, float_dtypes: the accepted integer / floating-point input dtypes.
        float32, int32: the framework's float32 and int32 dtypes.
        device_of: the device of an array, or None where the framework has no devices to match.
        is_contiguous: whether an array is dense in row-major order (None: always).
    """

    def __init__(
        self,
        array_type: type,
        array_label: str,
        dtype_prefix: str,
        int_dtypes: Sequence[Any],
        float_dtypes: Sequence[Any],
        float32: Any,
        int32: Any,
        device_of: Callable[[Any], Any] | None = None,
        is_contiguous: Callable[[Any], bool] | None = None,
    ) -> None:
        self.array_type = array_type
        self.array_label = array_label
        self.dtype_prefix = dtype_prefix
        self.int_dtypes = tuple(int_dtypes)
        self.float_dtypes = tuple(float_dtypes)
        self.float32 = float32
        self.int32 = int32
        self._device_of = device_of
        self._is_contiguous = is_contiguous

    def _dtype_name(self, dtype: Any) -> str:
        return str(dtype).replace(self.dtype_prefix, "")

    def device_of(self, a: Any) -> Any:
        return None if self._device_of is None else self._device_of(a)

    # -- one argument -----------------------------------------------------------------------------

    def array(self, op: str, name: str, a: object, dims: str, dtypes: Sequence[Any] | None = None,
              device: Any = None) -> Any:
        """Check type, rank (``len(dims.split(','))``), dtype and device of one argument.

        ``dims`` documents the expected shape in the message, e.g. ``"B, W, L"``.
        """
        if not isinstance(a, self.array_type):
            raise TypeError(f"{op}: {name} must be {self.array_label} of shape ({dims}), got {type(a).__name__}")
        ndim = len([d for d in dims.split(",") if d.strip()])
        if a.ndim != ndim:
            raise ValueError(f"{op}: {name} must have {ndim} dims ({dims}), got shape {tuple(a.shape)}")
        if dtypes is not None and a.dtype not in dtypes:
            names = ", ".join(self._dtype_name(d) for d in dtypes)
            raise TypeError(f"{op}: {name} must have dtype in ({names}), got {self._dtype_name(a.dtype)}")
        if device is not None and a.device != device:
            raise ValueError(f"{op}: {name} is on {a.device} but the other inputs are on {device}")
        return a

    @staticmethod
    def shape(op: str, name: str, a: Any, expected: Sequence[int], dims: str) -> None:
        if tuple(a.shape) != tuple(expected):
            raise ValueError(f"{op}: {name} must have shape ({dims}) = {tuple(expected)}, got {tuple(a.shape)}")

    # -- one op -----------------------------------------------------------------------------------

    def beam_topk(self, logits: Any, scores: Any, tokens: Any, state: Any, step: int) -> None:
        op = "beam_topk"
        self.array(op, "logits", logits, "B, W, V", self.float_dtypes)
        dev = self.device_of(logits)
        B, W, V = logits.shape
        self.array(op, "scores", scores, "B, W", (self.float32,), dev)
        self.array(op, "tokens", tokens, "B, W, L", self.int_dtypes, dev)
        self.array(op, "state", state, "B, W, D", self.float_dtypes, dev)
        if W < 1 or V < 1:
            raise ValueError(f"{op}: logits must have W >= 1 and V >= 1, got shape {tuple(logits.shape)}")
        self.shape(op, "scores", scores, (B, W), "B, W")
        if tuple(tokens.shape[:2]) != (B, W):
            raise ValueError(f"{op}: tokens must have shape (B, W, L) with B={B}, W={W}, got {tuple(tokens.shape)}")
        if tuple(state.shape[:2]) != (B, W):
            raise ValueError(f"{op}: state must have shape (B, W, D) with B={B}, W={W}, got {tuple(state.shape)}")
        check_int(op, "step", step, 1, tokens.shape[2], hint=f" (L = {tokens.shape[2]})")

    def build_trie(self, beams: Any) -> None:
        self.array("build_trie", "beams", beams, "B, W, L", self.int_dtypes)
        if beams.shape[1] < 1 or beams.shape[2] < 1:
            raise ValueError(f"build_trie: beams must have W >= 1 and L >= 1, got shape {tuple(beams.shape)}")

    def tree_mask(self, node_parent: Any, num_nodes: Any) -> None:
        op = "tree_mask"
        self.array(op, "node_parent", node_parent, "B, N", self.int_dtypes)
        self.array(op, "num_nodes", num_nodes, "B", self.int_dtypes, self.device_of(node_parent))
        if node_parent.shape[1] < 1:
            raise ValueError(f"{op}: node_parent must have N >= 1 nodes, got shape {tuple(node_parent.shape)}")
        self.shape(op, "num_nodes", num_nodes, node_parent.shape[:1], "B")

    def ngram_lookup(self, tokens: Any, length: Any, max_n: int, m: int) -> None:
        op = "ngram_lookup"
        self.array(op, "tokens", tokens, "B, S", self.int_dtypes)
        self.array(op, "length", length, "B", self.int_dtypes, self.device_of(tokens))
        if tokens.shape[1] < 1:
            raise ValueError(f"{op}: tokens must have S >= 1 columns, got shape {tuple(tokens.shape)}")
        self.shape(op, "length", length, tokens.shape[:1], "B")
        check_int(op, "max_n", max_n, 1, NGRAM_MAX)
        check_int(op, "m", m, 1, NGRAM_MAX)

    def verify(self, op: str, logits: Any, beams: Any, beam_node: Any) -> None:
        """The checks ``verify_greedy`` and ``verify_sample`` share; ``op`` names the op in messages."""
        self.array(op, "logits", logits, "B, N, V", self.float_dtypes)
        dev = self.device_of(logits)
        self.array(op, "beams", beams, "B, W, L", self.int_dtypes, dev)
        self.array(op, "beam_node", beam_node, "B, W, L", self.int_dtypes, dev)
        B, W, L = beams.shape
        if W < 1 or L < 1:
            raise ValueError(f"{op}: beams must have W >= 1 and L >= 1, got shape {tuple(beams.shape)}")
        if logits.shape[0] != B:
            raise ValueError(f"{op}: logits has batch {logits.shape[0]} but beams has batch {B}")
        if logits.shape[1] < num_nodes_max(W, L):
            raise ValueError(
                f"{op}: logits must cover N >= 1 + W*(L-1) = {num_nodes_max(W, L)} nodes, got shape {tuple(logits.shape)}"
            )
        if logits.shape[2] < 1:
            raise ValueError(f"{op}: logits must have 1 <= V < 2^31, got shape {tuple(logits.shape)}")
        self.shape(op, "beam_node", beam_node, beams.shape, "B, W, L")

    def verify_sample(
        self, logits: Any, beams: Any, beam_node: Any, accept_u: Any, sample_u: Any,
        temperature: float, top_k: int, top_p: float, *, verify_op: str = "verify_sample",
    ) -> None:
        """``verify_op`` names the op in the messages of the checks shared with ``verify_greedy``."""
        op = "verify_sample"
        self.verify(verify_op, logits, beams, beam_node)
        dev = self.device_of(logits)
        B, W, L = beams.shape
        self.array(op, "accept_u", accept_u, "B, L-1, W", (self.float32,), dev)
        self.array(op, "sample_u", sample_u, "B", (self.float32,), dev)
        self.shape(op, "accept_u", accept_u, (B, L - 1, W), "B, L-1, W")
        self.shape(op, "sample_u", sample_u, (B,), "B")
        self.sampling_args(op, temperature, top_k, top_p)

    # the scalar arguments of ``verify_sample``: Python numbers only (no bool, no rounding)
    sampling_args = staticmethod(check_sampling)

    def _kv_index(self, op: str, dev: Any, B: int, S: int, s_is: str, cache_len: Any, path_nodes: Any,
                  accept_len: Any) -> None:
        """The arguments ``kv_compact`` and ``kv_compact_paged`` share, for B rows of S slots."""
        self.array(op, "cache_len", cache_len, "B", (self.int32,), dev)
        self.array(op, "path_nodes", path_nodes, "B, L", self.int_dtypes, dev)
        self.array(op, "accept_len", accept_len, "B", self.int_dtypes, dev)
        self.shape(op, "cache_len", cache_len, (B,), "B")
        self.shape(op, "accept_len", accept_len, (B,), "B")
        if path_nodes.shape[0] != B:
            raise ValueError(f"{op}: path_nodes must have shape (B, L) with B={B}, got {tuple(path_nodes.shape)}")
        L = path_nodes.shape[1]
        if L < 1 or L > S:
            raise ValueError(f"{op}: path_nodes length L={L} must be in [1, S={S}]{s_is}")

    def _kv_cache(self, op: str, name: str, kv: Any, dims: str, two_axis: int) -> None:
        self.array(op, name, kv, dims, self.float_dtypes)
        if kv.shape[two_axis] != 2:
            raise ValueError(f"{op}: {name} dim {two_axis} must be 2 (K and V), got shape {tuple(kv.shape)}")
        if self._is_contiguous is not None and not self._is_contiguous(kv):
            raise ValueError(f"{op}: {name} must be contiguous (it is updated in place)")

    def kv_compact(self, kv: Any, cache_len: Any, path_nodes: Any, accept_len: Any) -> None:
        op = "kv_compact"
        self._kv_cache(op, "kv", kv, "n_layers, 2, B, H_kv, S, D", 1)
        self._kv_index(op, self.device_of(kv), kv.shape[2], kv.shape[4], "", cache_len, path_nodes, accept_len)

    def kv_compact_paged(self, kv_pages: Any, block_table: Any, cache_len: Any, path_nodes: Any,
                         accept_len: Any) -> None:
        op = "kv_compact_paged"
        self._kv_cache(op, "kv_pages", kv_pages, "n_layers, num_blocks, 2, H_kv, block_size, D", 2)
        dev = self.device_of(kv_pages)
        self.array(op, "block_table", block_table, "B, max_blocks", (self.int32,), dev)
        _, num_blocks, _, _, block_size, _ = kv_pages.shape
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"{op}: kv_pages must have num_blocks >= 1 and block_size >= 1, got shape {tuple(kv_pages.shape)}"
            )
        B, max_blocks = block_table.shape
        self._kv_index(op, dev, B, max_blocks * block_size, " (S = max_blocks * block_size)", cache_len, path_nodes,
                       accept_len)
