"""The ReDrafter drafter in MLX; loads the same checkpoint as ``redrafter_ext.drafter.Drafter``.

    s_t = SiLU(W e_t + U s_{t-1} + b),  s_0 = 0          e_t: target input embedding of token t
    x   = concat(h, s_t);  x = x + SiLU(Linear(x))  (num_layers times)
    logits = Linear(2H, V)(x)

Beam search runs L-1 such steps for W beams, each followed by the fused ``beam_topk`` op.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import mlx.core as mx
import mlx.nn as nn

__all__ = ["Drafter", "beam_search"]

CONFIG_NAME = "drafter_config.json"
WEIGHTS_NAME = "drafter.safetensors"

# step_fn(prev_tokens [B, w] i32, state [B, w, D]) -> (logits [B, w, V], new_state [B, w, D])
StepFn = Callable[[mx.array, mx.array], tuple[mx.array, mx.array]]


def beam_search(
    step_fn: StepFn, state0: mx.array, token: mx.array, beam_width: int, beam_length: int, ops: ModuleType
) -> mx.array:
    """Beam search over any step function with the fused ``beam_topk`` of ``ops`` (lazy, no host reads).

    Args:
        step_fn: ``(prev_tokens (B, w) i32, state (B, w, D)) -> (logits (B, w, V), state)``, called
            with w = 1 at the first step (only beam 0 is live) and w = W after.
        state0: ``(B, W, D)`` initial state, equal across beams.
        token: ``(B,)`` int, the guaranteed token (position 0 of every beam).
        ops: ``redrafter_ext.mlx.ops`` (native) or ``redrafter_ext.mlx.reference``.

    Returns:
        ``beams (B, W, L)`` int32 sorted by joint log-probability (ties to the lower index).
    """
    B = token.shape[0]
    W, L = beam_width, beam_length
    first = mx.arange(L)[None, None, :] == 0
    tokens = mx.where(first, token.astype(mx.int32)[:, None, None], mx.zeros((B, W, L), dtype=mx.int32))
    # only beam 0 is live at the first step, so the first expansion has no duplicate beams
    scores = mx.broadcast_to(mx.where(mx.arange(W) == 0, 0.0, -mx.inf).astype(mx.float32), (B, W))
    state = state0
    for step in range(1, L):
        if step == 1:
            # the other beams score -inf whatever their logits: run one beam and broadcast
            logits, state = step_fn(tokens[:, :1, 0], state[:, :1])
            logits = mx.broadcast_to(logits, (B, W, logits.shape[2]))
            state = mx.broadcast_to(state, (B, W, state.shape[2]))
        else:
            logits, state = step_fn(tokens[:, :, step - 1], state)
        scores, tokens, state, _ = ops.beam_topk(logits, scores, tokens, state, step)
    return tokens


class Drafter(nn.Module):
    """ReDrafter drafter: ``rnn_w`` (H->H), ``rnn_u`` (H->H + bias), ``blocks`` (num_layers x
    Linear(2H, 2H)), ``lm_head`` (Linear(2H, V)); parameter names match the torch checkpoint."""

    def __init__(self, hidden_size: int, vocab_size: int, num_layers: int = 2,
                 draft_vocab_size: int | None = None) -> None:
        super().__init__()
        H, V = hidden_size, vocab_size
        self.hidden_size, self.vocab_size, self.num_layers = H, V, num_layers
        self.rnn_w = nn.Linear(H, H, bias=False)
        self.rnn_u = nn.Linear(H, H, bias=True)
        self.blocks = [nn.Linear(2 * H, 2 * H) for _ in range(num_layers)]
        self.lm_head = nn.Linear(2 * H, V if draft_vocab_size is None else draft_vocab_size, bias=False)
        # reduced head: real token id of each head row (see redrafter_ext.drafter)
        if draft_vocab_size is not None:
            self.vocab_map = mx.arange(draft_vocab_size, dtype=mx.int32)

    @property
    def dtype(self) -> mx.Dtype:
        return self.lm_head.weight.dtype

    def rnn_step(self, emb: mx.array, state: mx.array) -> mx.array:
        """``emb (..., H)`` embedding of the previous token, ``state (..., H)`` -> new state."""
        return nn.silu(self.rnn_w(emb) + self.rnn_u(state))

    def logits(self, hidden: mx.array, state: mx.array) -> mx.array:
        """``hidden (..., H)`` target hidden, ``state (..., H)`` -> logits ``(..., V)``."""
        x = mx.concatenate([mx.broadcast_to(hidden, state.shape), state], axis=-1)
        for block in self.blocks:
            x = x + nn.silu(block(x))
        return self.lm_head(x)

    def beam_search(
        self, hidden: mx.array, token: mx.array, embed_weight: mx.array, beam_width: int, beam_length: int,
        ops: ModuleType,
    ) -> mx.array:
        """Draft W beams of L tokens: ``redrafter_ext.Drafter.beam_search`` on MLX arrays."""
        B, H = hidden.shape
        dtype = self.dtype
        h = hidden.astype(dtype)[:, None, :]  # [B, 1, H]

        vmap = self.get("vocab_map")
        calls = [0]

        def step(prev: mx.array, state: mx.array) -> tuple[mx.array, mx.array]:
            if vmap is not None and calls[0] > 0:  # beams hold draft indices after the first step
                prev = mx.take(vmap, prev, axis=0)
            calls[0] += 1
            emb = mx.take(embed_weight, prev, axis=0).astype(dtype)
            state = self.rnn_step(emb, state)
            return self.logits(h, state), state

        state0 = mx.zeros((B, beam_width, H), dtype=dtype)
        beams = beam_search(step, state0, token, beam_width, beam_length, ops)
        if vmap is None:
            return beams
        return mx.concatenate([beams[:, :, :1], mx.take(vmap, beams[:, :, 1:], axis=0)], axis=2)

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: mx.Dtype | None = None) -> Drafter:
        """Load ``drafter_config.json`` + ``drafter.safetensors`` (dtype: the checkpoint's by default)."""
        folder = Path(folder)
        cfg_path = folder / CONFIG_NAME
        if not cfg_path.is_file():
            raise FileNotFoundError(f"Drafter.from_pretrained: no {CONFIG_NAME} in {folder}")
        cfg = json.loads(cfg_path.read_text())
        if cfg.get("feature_layers"):
            raise ValueError(f"Drafter.from_pretrained: the drafter at {folder} conditions on target layers "
                             f"{cfg['feature_layers']} (kd --feature-layers), which the MLX backend does not support")
        model = cls(cfg["hidden_size"], cfg["vocab_size"], cfg.get("num_layers", 2), cfg.get("draft_vocab_size"))
        weights = mx.load(str(folder / WEIGHTS_NAME))
        dtype = dtype or weights["lm_head.weight"].dtype
        model.load_weights([(k, v.astype(mx.int32 if k == "vocab_map" else dtype)) for k, v in weights.items()],
                           strict=True)
        model.eval()
        mx.eval(model.parameters())
        return model
