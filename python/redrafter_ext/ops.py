"""Native ops (namespace ``torch.ops.redrafter``): thin wrappers with the reference's signatures.

Each wrapper calls the registered C++/CUDA kernel; a fake (meta) kernel registered here gives
output shapes to ``torch.compile`` and FakeTensor tracing without running anything. Ops without a
native kernel yet are taken from ``reference`` *by name* in ``NATIVE_OPS``, never silently.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import (
    _C,  # noqa: F401  (loads the TORCH_LIBRARY registrations)
    reference,
)
from ._checks import check_tree_mask

__all__ = ["tree_mask", "beam_topk", "build_trie", "verify_greedy", "kv_compact", "NATIVE_OPS"]

# which ops have a native kernel; the rest of this module re-exports the reference on purpose
NATIVE_OPS = ("tree_mask",)


def tree_mask(node_parent: Tensor, num_nodes: Tensor, packed: bool = False) -> Tensor:
    """Ancestor-or-self mask of the trie (native kernel). Same contract as ``reference.tree_mask``:
    ``node_parent (B, N)`` int, ``num_nodes (B,)`` int -> bool ``(B, N, N)`` or, when ``packed``,
    int32 ``(B, N, ceil(N/32))``.

    Example:
        >>> parent = torch.tensor([[-1, 0, 1, 0]]); n = torch.tensor([4])
        >>> tree_mask(parent, n).int()[0]
        tensor([[1, 0, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 0, 0, 1]], dtype=torch.int32)
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


beam_topk = reference.beam_topk
build_trie = reference.build_trie
verify_greedy = reference.verify_greedy
kv_compact = reference.kv_compact
