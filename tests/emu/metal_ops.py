"""Host side of the emulated Metal kernels: what csrc/metal/dispatch.cpp does with MLX's command
encoder (buffer indices, parameter blocks, grid and threadgroup sizes, kernel names), written over
numpy arrays and the emulator's ``dispatch``. Each function follows the comment block at the top
of its .metal file; keep it in step with dispatch.cpp.

Inputs are torch CPU tensors; integer inputs are cast to int32 as ``redrafter_ext.mlx.ops`` does;
outputs come back as torch tensors.
"""

from __future__ import annotations

import numpy as np
import torch

DTYPE_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def np_of(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy copy; 16-bit floats as their uint16 bits."""
    t = t.detach().contiguous().clone()
    if t.dtype in (torch.float16, torch.bfloat16):
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def i32(t: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.to(torch.int32).numpy())


def poison(*shape, dtype=np.int32) -> np.ndarray:
    return np.full(shape, -12345, dtype=dtype)  # every element must be written


def pack(emu, struct: str, **fields) -> np.ndarray:
    """A parameter block laid out as csrc/metal/params.h says (offsets from the compiled module)."""
    layout = emu.params_layout[struct]
    buf = np.zeros(layout["__size__"], dtype=np.uint8)
    assert set(fields) == set(layout) - {"__size__"}, f"{struct}: fields {sorted(fields)}"
    for name, value in fields.items():
        kind = np.float32 if isinstance(value, float) else np.int32
        buf[layout[name]: layout[name] + 4] = np.array([value], dtype=kind).view(np.uint8)
    return buf


def threads_for(n: int, cap: int = 1024) -> int:
    """n rounded up to a multiple of 32, between 32 and cap."""
    return max(32, min(cap, (n + 31) // 32 * 32))


def tree_mask(emu, node_parent: torch.Tensor, num_nodes: torch.Tensor, packed: bool) -> torch.Tensor:
    B, N = node_parent.shape
    words = (N + 31) // 32
    out = poison(B, N, words) if packed else np.ones((B, N, N), dtype=np.bool_)
    p = pack(emu, "TreeMaskParams", N=N, words=words)
    emu.dispatch("tree_mask_packed" if packed else "tree_mask_bool", [i32(node_parent), i32(num_nodes), out, p], B,
                 threads_for(N, 256))
    return torch.from_numpy(out)


def build_trie(emu, beams: torch.Tensor):
    B, W, L = beams.shape
    N = 1 + W * (L - 1)
    outs = [poison(B, N), poison(B, N), poison(B, N), poison(B, W, L), poison(B)]
    p = pack(emu, "BuildTrieParams", W=W, L=L, N=N)
    emu.dispatch("build_trie", [i32(beams), *outs, p], B, threads_for(W * (L - 1)))
    return [torch.from_numpy(o) for o in outs]


def ngram_lookup(emu, tokens: torch.Tensor, length: torch.Tensor, max_n: int, m: int,
                 threads: int | None = None) -> torch.Tensor:
    """``threads``: the threadgroup size (default dispatch.cpp's, min(256, S rounded up to 32))."""
    B, S = tokens.shape
    out = poison(B, m)
    if B == 0:  # dispatch.cpp encodes nothing
        return torch.from_numpy(out)
    p = pack(emu, "NgramLookupParams", S=S, max_n=max_n, m=m)
    emu.dispatch("ngram_lookup", [i32(tokens), i32(length), out, p], B, threads or threads_for(S, 256))
    return torch.from_numpy(out)


def _verify_params(emu, logits, beams, temperature=0.0, top_k=0, top_p=1.0):
    B, W, L = beams.shape
    return pack(emu, "VerifyParams", n_logit_rows=logits.shape[1], V=logits.shape[2], W=W, L=L,
                inv_temperature=float(1.0 / temperature) if temperature > 0 else 0.0, top_k=int(top_k),
                top_p=float(top_p))


def verify_greedy(emu, logits: torch.Tensor, beams: torch.Tensor, beam_node: torch.Tensor):
    B, W, L = beams.shape
    outs = [poison(B), poison(B), poison(B, L), poison(B)]
    p = _verify_params(emu, logits, beams)
    emu.dispatch(f"verify_greedy_{DTYPE_NAME[logits.dtype]}", [np_of(logits), i32(beams), i32(beam_node), *outs, p],
                 B, 32 * min(W, 32))
    return [torch.from_numpy(o) for o in outs]


def _copy(emu, src: np.ndarray) -> np.ndarray:
    """kv_copy_<n> into a garbage-filled array (dispatch.cpp's path when MLX cannot donate)."""
    dst = np.frombuffer(np.random.default_rng(0).bytes(src.nbytes), dtype=src.dtype).reshape(src.shape).copy()
    s, d = src.reshape(-1).view(np.uint8), dst.reshape(-1).view(np.uint8)
    n = next(n for n in (16, 8, 4, 2, 1) if s.size % n == 0 and s.ctypes.data % n == 0 and d.ctypes.data % n == 0)
    count = np.array([s.size // n], dtype=np.uint32)
    emu.dispatch(f"kv_copy_{n}", [s, d, count], max(1, min(65535, (int(count[0]) + 255) // 256)), 256)
    return dst


def kv_compact(emu, kv: torch.Tensor, cache_len: torch.Tensor, path_nodes: torch.Tensor, accept_len: torch.Tensor,
               donate: bool = True):
    """Returns the compacted (kv, cache_len); the inputs are not modified. donate=False copies the
    inputs with kv_copy first, as dispatch.cpp does when MLX cannot reuse the input buffers."""
    n_layers, two, B, H, S, D = kv.shape
    L = path_nodes.shape[1]
    kv_np = np.ascontiguousarray(np_of(kv))
    cl = i32(cache_len).copy()
    if not donate:
        kv_np, cl = _copy(emu, kv_np), _copy(emu, cl)
    raw = kv_np.reshape(-1).view(np.uint8)
    slot = D * kv.element_size()
    vec = next(n for n in (16, 8, 4, 2, 1) if slot % n == 0 and raw.ctypes.data % n == 0)
    units = n_layers * 2 * B * H
    p = pack(emu, "KvCompactParams", units=units, B=B, H=H, S=S, vecs=slot // vec, L=L)
    groups = max(1, min(65535, (units * (slot // vec) + 255) // 256))
    emu.dispatch(f"kv_compact_{vec}", [raw, cl, i32(path_nodes), i32(accept_len), p], groups, 256)
    emu.dispatch("kv_compact_advance", [cl, i32(path_nodes), i32(accept_len), p], max(1, (B + 255) // 256), 256)
    out = torch.from_numpy(kv_np)
    if kv.dtype in (torch.float16, torch.bfloat16):
        out = out.view(torch.int16).view(kv.dtype)
    return out, torch.from_numpy(cl)


def beam_topk(emu, logits, scores, tokens, state, step: int):
    B, W, V = logits.shape
    L, D = tokens.shape[2], state.shape[2]
    C = min(W, V)
    row_f = np.full((B * W, W), np.nan, dtype=np.float32)  # workspace (garbage is fine)
    row_i = poison(B * W, W)
    order = poison(B, W)
    scores_out = np.full((B, W), 12345.0, dtype=np.float32)
    tokens_out, parent_out = poison(B, W, L), poison(B, W)
    state_units = D * state.element_size() // 2
    state_in = np_of(state).reshape(B, W, -1).view(np.uint16)
    state_out = np.full((B, W, state_units), 0x7777, dtype=np.uint16)
    p = pack(emu, "BeamTopkParams", W=W, V=V, L=L, step=step, C=C, state_units=state_units)
    name = DTYPE_NAME[logits.dtype]
    emu.dispatch(f"beam_topk_rows_{name}", [np_of(logits), np_of(scores.float()), row_f, row_i, p], B * W,
                 threads_for((V + 7) // 8, 256))
    emu.dispatch("beam_topk_merge", [row_f, row_i, i32(tokens), state_in, scores_out, tokens_out, state_out,
                                     parent_out, order, p], B, threads_for(W * C, 256))
    st = torch.from_numpy(state_out.view(np.int16).copy()).view(torch.int16)
    if state.dtype == torch.float32:
        st = st.view(torch.int32).view(torch.float32)
    else:
        st = st.view(state.dtype)
    return torch.from_numpy(scores_out), torch.from_numpy(tokens_out), st.reshape(B, W, D), torch.from_numpy(parent_out)


def verify_sample(emu, logits, beams, beam_node, accept_u, sample_u, temperature: float, top_k: int = 0,
                  top_p: float = 1.0):
    if temperature == 0.0:  # greedy exactly, as dispatch.cpp does
        return verify_greedy(emu, logits, beams, beam_node)
    B, W, L = beams.shape
    V = logits.shape[2]
    outs = [poison(B), poison(B), poison(B, L), poison(B)]
    probs = np.full((B, V), np.nan, dtype=np.float32)  # workspace
    p = _verify_params(emu, logits, beams, temperature, top_k, top_p)
    emu.dispatch(f"verify_sample_{DTYPE_NAME[logits.dtype]}",
                 [np_of(logits), i32(beams), i32(beam_node), np_of(accept_u.float()), np_of(sample_u.float()),
                  *outs, probs, p], B, threads_for((V + 7) // 8))
    return [torch.from_numpy(o) for o in outs]


# The negative controls (tests/emu/metal_negative.metal) under the names both emulators' tests use.
_NEGATIVE = {"missing_barrier": "missing_barrier", "divergent_barrier": "divergent_barrier",
             "exit_before_barrier": "exit_before_barrier", "divergent_collective": "divergent_simd"}


def negative(emu, which: str) -> np.ndarray:
    """Runs a kernel with a deliberate bug (one threadgroup of 64); returns its output."""
    out = poison(64)
    emu.dispatch(_NEGATIVE[which], [out], 1, 64)
    return out
