"""Host side of the emulated CUDA kernels (csrc/cuda/*.cu through tests/shim), as tests/emu/metal_ops.py
is for Metal: one function per op with the reference's arguments (torch CPU tensors in, torch
tensors out), over numpy buffers and the module's bindings (tests/emu/module.cpp). Outputs start
poisoned, so an element the kernel fails to write shows up.

Each function runs one schedule: set it first with ``emu.set_seed``.
"""

from __future__ import annotations

import numpy as np
import torch

KIND16 = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def np_of(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy copy; 16-bit floats as their uint16 bits."""
    t = t.detach().contiguous().clone()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def poison(*shape) -> np.ndarray:
    return np.full(shape, -12345, dtype=np.int32)  # every element must be written


def _tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A numpy buffer from ``np_of`` back as a tensor of ``dtype``."""
    t = torch.from_numpy(a)
    return t.view(torch.int16).view(dtype) if dtype in (torch.float16, torch.bfloat16) else t


def build_trie(emu, beams: torch.Tensor):
    B, W, L = beams.shape
    N = 1 + W * (L - 1)
    outs = (poison(B, N), poison(B, N), poison(B, N), poison(B, W, L), poison(B))
    emu.build_trie(np_of(beams), *outs)
    return [torch.from_numpy(o) for o in outs]


def tree_mask(emu, node_parent: torch.Tensor, num_nodes: torch.Tensor, packed: bool) -> torch.Tensor:
    B, N = node_parent.shape
    out = poison(B, N, (N + 31) // 32) if packed else np.ones((B, N, N), dtype=np.bool_)
    emu.tree_mask(np_of(node_parent.to(torch.int32)), np_of(num_nodes.to(torch.int32)), packed, out)
    return torch.from_numpy(out)


def ngram_lookup(emu, tokens: torch.Tensor, length: torch.Tensor, max_n: int, m: int) -> torch.Tensor:
    """tokens and length in their common index dtype (int64 if either is), as the torch launcher
    passes them; length may lie outside [0, S] (the kernel clamps it)."""
    idx = torch.promote_types(tokens.dtype, length.dtype)
    drafts = poison(tokens.shape[0], m)
    emu.ngram_lookup(np_of(tokens.to(idx)), np_of(length.to(idx)), max_n, drafts)
    return torch.from_numpy(drafts)


def verify_greedy(emu, logits: torch.Tensor, beams: torch.Tensor, beam_node: torch.Tensor, strategy: int = 0):
    """``strategy``: 0 the kernel's own choice, 1 the per-node argmax, 2 the lazy depth-by-depth walk."""
    B, W, L = beams.shape
    outs = (poison(B), poison(B), poison(B, L), poison(B))
    emu.verify_greedy_set_strategy(strategy)
    try:
        emu.verify_greedy(np_of(logits), KIND16[logits.dtype], np_of(beams), np_of(beam_node), *outs)
    finally:
        emu.verify_greedy_set_strategy(0)
    return [torch.from_numpy(o) for o in outs]


def kv_compact(emu, kv: torch.Tensor, cache_len: torch.Tensor, path_nodes: torch.Tensor, accept_len: torch.Tensor):
    """Returns the compacted (kv, cache_len); the inputs are not modified."""
    k, c = np_of(kv), np_of(cache_len)
    emu.kv_compact(k, c, np_of(path_nodes), np_of(accept_len))
    return _tensor(k, kv.dtype), torch.from_numpy(c)


def beam_topk(emu, logits, scores, tokens, state, step: int):
    B, W, V = logits.shape
    L, D = tokens.shape[2], state.shape[2]
    scores_out = np.full((B, W), 12345.0, dtype=np.float32)
    tokens_out, parent_out = poison(B, W, L), poison(B, W)
    state_out = np_of(torch.full((B, W, D), 777.0, dtype=state.dtype))
    ws = np.empty(emu.beam_topk_workspace_bytes(B, W, V) + 64, dtype=np.uint8)
    off = (-ws.ctypes.data) % 16  # the workspace is 16-byte aligned, as cudaMalloc's
    emu.beam_topk(np_of(logits), KIND16[logits.dtype], np_of(scores), np_of(tokens), np_of(state), step,
                  scores_out, tokens_out, state_out, parent_out, ws[off:])
    return (torch.from_numpy(scores_out), torch.from_numpy(tokens_out), _tensor(state_out, state.dtype),
            torch.from_numpy(parent_out))


def verify_sample(emu, logits, beams, beam_node, accept_u, sample_u, temperature: float, top_k: int = 0,
                  top_p: float = 1.0):
    B, W, L = beams.shape
    outs = (poison(B), poison(B), poison(B, L), poison(B))
    ws = np.full(max(1, B * logits.shape[2]), np.nan)  # poison: the kernel writes before it reads
    emu.verify_sample(np_of(logits), KIND16[logits.dtype], np_of(beams), np_of(beam_node), np_of(accept_u),
                      np_of(sample_u), temperature, top_k, top_p, *outs, ws)
    return [torch.from_numpy(o) for o in outs]


# The negative controls (tests/emu/negative.cu) under the names both emulators' tests use.
_NEGATIVE = {"missing_barrier": "missing_sync", "divergent_barrier": "divergent_barrier",
             "exit_before_barrier": "exit_before_barrier", "divergent_collective": "divergent_shuffle"}


def negative(emu, which: str) -> np.ndarray:
    """Runs a kernel with a deliberate bug; returns its output (64 values for missing_barrier)."""
    out = poison(64 if which == "missing_barrier" else 32)
    emu.negative(_NEGATIVE[which], out)
    return out
