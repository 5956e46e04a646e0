"""Input validation shared by the reference ops and the native-op wrappers.

Every check reads only metadata (rank, shape, dtype, device), never tensor values, so it costs no
host synchronisation. Errors name the argument and say what was expected.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

INT_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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
    if not isinstance(t, Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor of shape ({dims}), got {type(t).__name__}")
    ndim = len([d for d in dims.split(",") if d.strip()])
    if t.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dims ({dims}), got shape {tuple(t.shape)}")
    if dtypes is not None and t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{op}: {name} must have dtype in ({names}), got {str(t.dtype).replace('torch.', '')}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but the other inputs are on {device}")
    return t


def check_shape(op: str, name: str, t: Tensor, expected: Sequence[int], dims: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{op}: {name} must have shape ({dims}) = {tuple(expected)}, got {tuple(t.shape)}")


def check_beam_topk(logits: Tensor, scores: Tensor, tokens: Tensor, state: Tensor, step: int) -> None:
    op = "beam_topk"
    check_tensor(op, "logits", logits, "B, W, V", FLOAT_DTYPES)
    dev = logits.device
    B, W, V = logits.shape
    check_tensor(op, "scores", scores, "B, W", (torch.float32,), dev)
    check_tensor(op, "tokens", tokens, "B, W, L", INT_DTYPES, dev)
    check_tensor(op, "state", state, "B, W, D", FLOAT_DTYPES, dev)
    if W < 1 or V < 1:
        raise ValueError(f"{op}: logits must have W >= 1 and V >= 1, got shape {tuple(logits.shape)}")
    if W > W * V:
        raise ValueError(f"{op}: beam width W={W} exceeds the W*V={W * V} candidates")
    check_shape(op, "scores", scores, (B, W), "B, W")
    if tokens.shape[:2] != (B, W):
        raise ValueError(f"{op}: tokens must have shape (B, W, L) with B={B}, W={W}, got {tuple(tokens.shape)}")
    if state.shape[:2] != (B, W):
        raise ValueError(f"{op}: state must have shape (B, W, D) with B={B}, W={W}, got {tuple(state.shape)}")
    if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step < tokens.shape[2]:
        raise ValueError(f"{op}: step must be an int in [1, L) with L={tokens.shape[2]}, got {step!r}")


def check_build_trie(beams: Tensor) -> None:
    check_tensor("build_trie", "beams", beams, "B, W, L", INT_DTYPES)
    if beams.shape[1] < 1 or beams.shape[2] < 1:
        raise ValueError(f"build_trie: beams must have W >= 1 and L >= 1, got shape {tuple(beams.shape)}")


def check_tree_mask(node_parent: Tensor, num_nodes: Tensor) -> None:
    op = "tree_mask"
    check_tensor(op, "node_parent", node_parent, "B, N", INT_DTYPES)
    check_tensor(op, "num_nodes", num_nodes, "B", INT_DTYPES, node_parent.device)
    if node_parent.shape[1] < 1:
        raise ValueError(f"{op}: node_parent must have N >= 1 nodes, got shape {tuple(node_parent.shape)}")
    check_shape(op, "num_nodes", num_nodes, node_parent.shape[:1], "B")


def check_verify_greedy(logits: Tensor, beams: Tensor, beam_node: Tensor) -> None:
    op = "verify_greedy"
    check_tensor(op, "logits", logits, "B, N, V", FLOAT_DTYPES)
    dev = logits.device
    check_tensor(op, "beams", beams, "B, W, L", INT_DTYPES, dev)
    check_tensor(op, "beam_node", beam_node, "B, W, L", INT_DTYPES, dev)
    B, W, L = beams.shape
    if W < 1 or L < 1:
        raise ValueError(f"{op}: beams must have W >= 1 and L >= 1, got shape {tuple(beams.shape)}")
    if logits.shape[0] != B:
        raise ValueError(f"{op}: logits has batch {logits.shape[0]} but beams has batch {B}")
    if logits.shape[1] < 1 + W * (L - 1):
        raise ValueError(
            f"{op}: logits must cover N >= 1 + W*(L-1) = {1 + W * (L - 1)} nodes, got shape {tuple(logits.shape)}"
        )
    if logits.shape[2] < 1:
        raise ValueError(f"{op}: logits must have 1 <= V < 2^31, got shape {tuple(logits.shape)}")
    check_shape(op, "beam_node", beam_node, beams.shape, "B, W, L")


def check_kv_compact(kv: Tensor, cache_len: Tensor, path_nodes: Tensor, accept_len: Tensor) -> None:
    op = "kv_compact"
    check_tensor(op, "kv", kv, "n_layers, 2, B, H_kv, S, D", FLOAT_DTYPES)
    dev = kv.device
    check_tensor(op, "cache_len", cache_len, "B", (torch.int32,), dev)
    check_tensor(op, "path_nodes", path_nodes, "B, L", INT_DTYPES, dev)
    check_tensor(op, "accept_len", accept_len, "B", INT_DTYPES, dev)
    n_layers, two, B, H, S, D = kv.shape
    if two != 2:
        raise ValueError(f"kv_compact: kv dim 1 must be 2 (K and V), got shape {tuple(kv.shape)}")
    if not kv.is_contiguous():
        raise ValueError("kv_compact: kv must be contiguous")
    check_shape(op, "cache_len", cache_len, (B,), "B")
    check_shape(op, "accept_len", accept_len, (B,), "B")
    if path_nodes.shape[0] != B:
        raise ValueError(f"kv_compact: path_nodes must have shape (B, L) with B={B}, got {tuple(path_nodes.shape)}")
    L = path_nodes.shape[1]
    if L < 1 or L > S:
        raise ValueError(f"kv_compact: path_nodes length L={L} must be in [1, S={S}]")


def check_verify_sample(
    logits: Tensor, beams: Tensor, beam_node: Tensor, accept_u: Tensor, sample_u: Tensor,
    temperature: float, top_k: int, top_p: float,
) -> None:
    op = "verify_sample"
    check_verify_greedy(logits, beams, beam_node)
    dev = logits.device
    B, W, L = beams.shape
    check_tensor(op, "accept_u", accept_u, "B, L-1, W", (torch.float32,), dev)
    check_tensor(op, "sample_u", sample_u, "B", (torch.float32,), dev)
    check_shape(op, "accept_u", accept_u, (B, L - 1, W), "B, L-1, W")
    check_shape(op, "sample_u", sample_u, (B,), "B")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not (
        0.0 <= float(temperature) < float("inf")
    ):
        raise ValueError(f"{op}: temperature must be a finite float >= 0, got {temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"{op}: top_k must be an int >= 0 (0: no top-k), got {top_k!r}")
    if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0.0 < float(top_p) <= 1.0:
        raise ValueError(f"{op}: top_p must be a float in (0, 1] (1: no top-p), got {top_p!r}")
