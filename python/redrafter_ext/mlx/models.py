"""A Llama target in MLX with the caller-owned KV cache and tree forward ``decode_step`` needs.

Same architecture and checkpoint format as ``redrafter_ext.models.LlamaTarget`` (Hugging Face
``LlamaForCausalLM``: RMSNorm, rotate-half RoPE, GQA, SwiGLU, optional tied embeddings). mlx-lm's
stock forward takes neither a mask nor explicit positions, so this has its own layer loop.

KV cache (owned by the caller, see ``new_kv_cache``): ``(n_layers, 2, B, n_kv_heads, S, head_dim)``,
index 0 = K, 1 = V. MLX is functional: ``forward`` returns the updated cache.

The target protocol (MLX flavour) an engine implements to use ``redrafter_ext.mlx.decode_step``:

    vocab_size: int; hidden_size: int; embed_weight: mx.array (V, H)
    forward(tokens (B, T) int, positions (B, T) int, tree_mask (B, T, T) bool, cache_len (B,) int32,
            kv) -> (logits (B, T, V) float32, hidden (B, T, H) after the final norm, kv)
        writes the K/V of token t at slot cache_len[b] + t; token t attends to every slot
        < cache_len[b] and to tree token j where tree_mask[b, t, j].
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..config import ConfigSizes, LlamaConfig, read_checkpoint  # plain Python: redrafter_ext.mlx needs no torch

__all__ = ["LlamaConfig", "LlamaTarget", "causal_tree_mask", "tree_visibility"]


def causal_tree_mask(batch: int, T: int) -> mx.array:
    """A chain 'tree' for prefill: ``(B, T, T)`` bool lower-triangular."""
    i = mx.arange(T)
    return mx.broadcast_to(i[None, :] <= i[:, None], (batch, T, T))


def tree_visibility(tree_mask: mx.array, cache_len: mx.array, S: int) -> mx.array:
    """Which of S cache slots each tree node attends to: ``(B, T, S)`` bool (as the torch one).

    ``tree_mask (B, T, T)`` bool ancestor-or-self, ``cache_len (B,)`` int. Slot s is visible from
    node t if it is committed (``s < cache_len``) or an ancestor-or-self of t in the tree block
    written at ``cache_len .. cache_len+T-1``. Fixed shapes, no host read.
    """
    B, T, _ = tree_mask.shape
    rel = mx.arange(S, dtype=mx.int32)[None, :] - cache_len.astype(mx.int32)[:, None]  # [B, S]
    in_tree = (rel >= 0) & (rel < T)
    tree = mx.take_along_axis(tree_mask, mx.broadcast_to(mx.clip(rel, 0, T - 1)[:, None, :], (B, T, S)), axis=2)
    return (rel < 0)[:, None, :] | (in_tree[:, None, :] & tree)


def _rotate_half(x: mx.array) -> mx.array:
    half = x.shape[-1] // 2
    return mx.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _linears(module: nn.Module, c: LlamaConfig, group: str) -> None:
    """The bias-free projections of ``group`` ("self_attn" or "mlp"), named as Hugging Face does."""
    for name, (n_in, n_out) in c.layer_linears().items():
        if name.startswith(group + "."):
            setattr(module, name.split(".")[1], nn.Linear(n_in, n_out, bias=False))


class _Attention(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        _linears(self, c, "self_attn")


class _MLP(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        _linears(self, c, "mlp")

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class _Layer(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = _MLP(c)
        self.input_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)


class _Body(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = [_Layer(c) for _ in range(c.num_hidden_layers)]
        self.norm = nn.RMSNorm(c.hidden_size, eps=c.rms_norm_eps)


class TreeForward:
    """The protocol's ``__call__`` / ``forward`` / ``prefill``, once for every MLX target, over the
    target's ``_body`` (hidden states after the final norm, the cache with the new K/V written),
    ``_head`` (float32 logits) and ``_check`` (metadata checks; none by default)."""

    def _check(self, op: str, tokens: mx.array, positions: mx.array, tree_mask: mx.array, cache_len: mx.array,
               kv: mx.array, lengths: mx.array | None = None) -> None:
        pass

    def __call__(
        self, tokens: mx.array, positions: mx.array, tree_mask: mx.array, cache_len: mx.array, kv: mx.array
    ) -> tuple[mx.array, mx.array, mx.array]:
        """Tree forward (see the module docstring); lazy, fixed shapes, no host reads.

        tokens, positions ``(B, T)`` int; tree_mask ``(B, T, T)`` bool; cache_len ``(B,)`` int;
        kv ``(n_layers, 2, B, H_kv, S, D)``. Returns ``logits (B, T, V)`` float32, ``hidden (B, T, H)``
        after the final norm, and the cache with token t's K/V at slot ``cache_len[b] + t``.
        """
        self._check(f"{type(self).__name__}.forward", tokens, positions, tree_mask, cache_len, kv)
        hidden, kv = self._body(tokens, positions, tree_mask, cache_len, kv)
        return self._head(hidden), hidden, kv

    def forward(self, *args: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        return self(*args)

    def prefill(self, tokens: mx.array, lengths: mx.array, kv: mx.array) -> tuple[mx.array, mx.array, mx.array]:
        """Run right-padded prompts ``tokens (B, T)`` of ``lengths (B,)`` into slots 0..T-1 of ``kv``.

        Returns ``logits (B, V)`` float32 and ``hidden (B, H)`` at each row's last prompt token, and
        the cache. Only the last positions go through the LM head.
        """
        B, T = tokens.shape
        positions = mx.broadcast_to(mx.arange(T, dtype=mx.int32)[None, :], (B, T))
        cache_len = mx.zeros((B,), dtype=mx.int32)
        tree = causal_tree_mask(B, T)
        self._check(f"{type(self).__name__}.prefill", tokens, positions, tree, cache_len, kv, lengths)
        hidden, kv = self._body(tokens, positions, tree, cache_len, kv)
        last = mx.clip(lengths.astype(mx.int32) - 1, 0, T - 1)[:, None, None]
        hidden = mx.take_along_axis(hidden, mx.broadcast_to(last, (B, 1, hidden.shape[2])), axis=1)[:, 0]
        return self._head(hidden), hidden, kv


class LlamaTarget(ConfigSizes, TreeForward, nn.Module):
    """Llama causal LM with an explicit, caller-owned KV cache and tree attention (parameter names
    are Hugging Face's, so a checkpoint loads as is)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.model = _Body(c)
        if not c.tie_word_embeddings:
            self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self._inv_freq = 1.0 / (c.rope_theta ** (mx.arange(0, c.head_dim, 2, dtype=mx.float32) / c.head_dim))

    # -- protocol (vocab_size, hidden_size: ConfigSizes) ----------------------------------------
    @property
    def embed_weight(self) -> mx.array:
        return self.model.embed_tokens.weight

    @property
    def dtype(self) -> mx.Dtype:
        return self.embed_weight.dtype

    def new_kv_cache(self, batch: int, max_len: int, dtype: mx.Dtype | None = None) -> mx.array:
        """Zeroed cache ``(n_layers, 2, batch, n_kv_heads, max_len, head_dim)``."""
        c = self.config
        shape = (c.num_hidden_layers, 2, batch, c.num_key_value_heads, max_len, c.head_dim)
        return mx.zeros(shape, dtype=dtype or self.dtype)

    def _head(self, hidden: mx.array) -> mx.array:
        w = self.embed_weight if self.config.tie_word_embeddings else self.lm_head.weight
        return (hidden @ w.T).astype(mx.float32)

    def _body(
        self, tokens: mx.array, positions: mx.array, tree_mask: mx.array, cache_len: mx.array, kv: mx.array
    ) -> tuple[mx.array, mx.array]:
        """Hidden states ``(B, T, H)`` after the final norm, and the cache with the new K/V written."""
        c = self.config
        B, T = tokens.shape
        S = kv.shape[4]
        Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        x = self.model.embed_tokens(tokens)  # [B, T, H]

        # rotary tables for the explicit positions: [B, 1, T, D]
        freqs = positions.astype(mx.float32)[..., None] * self._inv_freq
        emb = mx.concatenate([freqs, freqs], axis=-1)
        cos, sin = mx.cos(emb)[:, None].astype(x.dtype), mx.sin(emb)[:, None].astype(x.dtype)

        # keys = [the S cache slots ; the T new tokens]: a slot is visible when committed
        # (< cache_len), a new token j when tree_mask[t, j]. The stale tree slots of the cache are
        # never visible, so the new K/V can be written back once, after the last layer.
        committed = mx.arange(S)[None, :] < cache_len[:, None]  # [B, S]
        visible = mx.concatenate([mx.broadcast_to(committed[:, None, :], (B, T, S)), tree_mask], axis=2)[:, None]
        new_kv = []
        for i, layer in enumerate(self.model.layers):
            a = layer.self_attn
            h = layer.input_layernorm(x)
            q = a.q_proj(h).reshape(B, T, Hq, D).transpose(0, 2, 1, 3)
            k = a.k_proj(h).reshape(B, T, Hkv, D).transpose(0, 2, 1, 3)
            v = a.v_proj(h).reshape(B, T, Hkv, D).transpose(0, 2, 1, 3)
            q = q * cos + _rotate_half(q) * sin
            k = (k * cos + _rotate_half(k) * sin).astype(kv.dtype)
            v = v.astype(kv.dtype)
            keys = mx.concatenate([kv[i, 0], k], axis=2).astype(q.dtype)
            values = mx.concatenate([kv[i, 1], v], axis=2).astype(q.dtype)
            o = mx.fast.scaled_dot_product_attention(q, keys, values, scale=D**-0.5, mask=visible)
            x = x + a.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, Hq * D))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            new_kv.append(mx.stack([k, v]))
        # one scatter of every layer's K/V at slots cache_len + t (clamped: the caller guarantees room)
        upd = mx.stack(new_kv)  # [n_layers, 2, B, Hkv, T, D]
        slots = mx.minimum(cache_len[:, None] + mx.arange(T)[None, :], S - 1).astype(mx.int32)
        kv = mx.put_along_axis(kv, mx.broadcast_to(slots[None, None, :, None, :, None], upd.shape), upd, axis=4)
        return self.model.norm(x), kv

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: mx.Dtype = mx.float32) -> LlamaTarget:
        """Load a Hugging Face Llama checkpoint folder (config.json + *.safetensors) in ``dtype``."""
        config, files = read_checkpoint(folder, "LlamaTarget.from_pretrained")
        model = cls(config)
        weights: dict[str, mx.array] = {}
        for f in files:
            weights.update(mx.load(str(f)))
        if model.config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        model.load_weights([(k, v.astype(dtype)) for k, v in weights.items()], strict=True)
        model.eval()
        mx.eval(model.parameters())
        return model
