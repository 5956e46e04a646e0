"""An unchanged mlx-lm Llama model as the target of ``redrafter_ext.mlx.decode_step``.

    from redrafter_ext.mlx.adapters.mlx_lm import MLXLMTarget
    target = MLXLMTarget.from_pretrained(folder)   # mlx_lm.load of a local folder; or MLXLMTarget(model)
    out = redrafter_ext.mlx.generate(target, drafter, prompts, 64, beam_width=1, beam_length=8)

mlx-lm's ``Model.__call__(inputs, cache)`` takes no mask and no positions: the attention mask comes
from the cache object (``cache.make_mask``), RoPE reads ``cache.offset`` and K/V go through
``cache.update_and_fetch``. The adapter therefore hands mlx-lm's own layer loop (``model.model``,
which returns the final-norm hidden state the drafter reads), for every forward, one
``TreeKVCache`` per layer:
  * ``update_and_fetch`` scatters the T new K/V rows into that layer's ``(B, H_kv, S, D)`` slice of
    the caller-owned cache at slots ``cache_len[b] + t`` and returns the whole slices;
  * ``make_mask`` returns the tree mask ``(B, 1, T, S)`` bool: slot s is visible from node t when
    ``s < cache_len[b]`` or ``s = cache_len[b] + j`` with ``tree_mask[b, t, j]``;
  * ``offset`` is the ``(B, T)`` positions array (tree depth + cache length). mlx-lm's RoPE modules
    take an int or a ``(B,)`` offset only, so ``MLXLMTarget(model)`` wraps each layer's
    ``self_attn.rope`` once, in place (``TokenRoPE``): a 2-D offset gives every token its own
    position, anything else goes to the original module unchanged, so the model keeps working with
    mlx-lm's own caches and ``generate``, bit for bit. No mlx-lm file is edited.

Cost per forward on top of mlx-lm's own compute (B rows, T tree nodes, S cache slots, n layers,
Hq query heads, Hkv KV heads, head dim D):
  * mask build, once per forward: one ``(B, T, S)`` bool gather + compare, shared by all layers;
  * RoPE, per layer: q and k are transposed to one row per token ``(B*T, H, 1, D)`` (mx.fast.rope
    takes one offset per leading row) and back: four copies of ``B*(Hq+Hkv)*T*D`` elements;
  * tree write, per layer: ``put_along_axis`` of ``2 * B * Hkv * T * D`` elements into K and V.
    MLX arrays are immutable and the caller's cache is still referenced, so each scatter copies the
    layer's K and V (``2 * B * Hkv * S * D`` elements); the n updated layers are then stacked into
    the returned ``(n_layers, 2, B, Hkv, S, D)`` cache: one more copy of the whole cache. About two
    cache copies per forward, where ``redrafter_ext.mlx.LlamaTarget`` makes about two as well
    (``[cache ; new]`` concatenated per layer, one scatter after the last layer);
  * attention runs over all S slots, masked (fixed shapes), through mlx-lm's
    ``mx.fast.scaled_dot_product_attention`` call, whose GQA needs no K/V head expansion;
  * logits cast to float32 when the model is not float32. ``prefill`` applies the LM head to the
    last prompt token of each row only.
Lazy, fixed shapes, no host reads (no ``.item()``, ``.tolist()``, numpy conversion) in a forward.

Supported: mlx-lm's Llama architecture (``mlx_lm.models.llama``: ``model_type`` ``"llama"`` and
the types mlx-lm loads as Llama, e.g. ``"mistral"``), full attention in every layer, float or
quantized weights (a quantized embedding table is dequantized once for the drafter).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ...config import ConfigSizes
from .._checks import FLOAT_DTYPES, INT_DTYPES, check_array
from ..models import TreeForward, tree_visibility

__all__ = ["MLXLMTarget", "TokenRoPE", "TreeKVCache", "supported_model_types"]

_LLAMA_MODULE = "mlx_lm.models.llama"


def supported_model_types() -> tuple[str, ...]:
    """``config.json`` model types that mlx-lm loads as its Llama (``"llama"`` and its remappings)."""
    from mlx_lm.utils import MODEL_REMAPPING

    return ("llama",) + tuple(sorted(k for k, v in MODEL_REMAPPING.items() if v == "llama"))


class TokenRoPE(nn.Module):
    """A layer's RoPE module that also takes one position per token: ``offset (B, T)`` int.

    ``x (B, H, T, D)``. With a 2-D ``offset`` each token is rotated by the wrapped module at its own
    position (as a batch of single-token rows, so every RoPE variant of mlx-lm keeps its own
    frequencies and scaling); any other ``offset`` (int, ``(B,)``) calls the wrapped module as is.
    """

    def __init__(self, rope: nn.Module) -> None:
        super().__init__()
        self.inner = rope

    def __call__(self, x: mx.array, offset: int | mx.array = 0) -> mx.array:
        if isinstance(offset, mx.array) and offset.ndim == 2:
            B, H, T, D = x.shape
            rows = x.transpose(0, 2, 1, 3).reshape(B * T, H, 1, D)
            y = self.inner(rows, offset=offset.reshape(B * T).astype(mx.int32))
            return y.reshape(B, T, H, D).transpose(0, 2, 1, 3)
        return self.inner(x, offset=offset)


class TreeKVCache:
    """mlx-lm's per-layer cache interface over one layer of a caller-owned cache, for one forward.

    keys, values ``(B, H_kv, S, D)``: this layer's slices of the caller's cache; slots ``(B, H_kv, T,
    D)`` int32: where the T new rows go (``cache_len[b] + t``, clamped into the cache); positions
    ``(B, T)`` int: the RoPE position of each new token (read by the model as ``offset``); mask
    ``(B, 1, T, S)`` bool: the tree visibility (read by the model through ``make_mask``).
    """

    def __init__(self, keys: mx.array, values: mx.array, slots: mx.array, positions: mx.array,
                 mask: mx.array) -> None:
        self.keys, self.values = keys, values
        self.slots = slots
        self.offset = positions  # mlx-lm passes cache.offset to the layer's rope: TokenRoPE reads it
        self.mask = mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        # the protocol's write: the T new rows at cache_len + t; attention then reads all S slots
        self.keys = mx.put_along_axis(self.keys, self.slots, keys.astype(self.keys.dtype), axis=2)
        self.values = mx.put_along_axis(self.values, self.slots, values.astype(self.values.dtype), axis=2)
        return self.keys, self.values

    def make_mask(self, N: int, return_array: bool = False, window_size: int | None = None) -> mx.array:
        if window_size is not None:  # MLXLMTarget rejects sliding-window models; never reached
            raise ValueError("TreeKVCache: sliding-window attention is not supported")
        return self.mask

    # the rest of mlx-lm's cache interface, for its utilities
    @property
    def state(self) -> tuple[mx.array, mx.array]:
        return self.keys, self.values

    def is_trimmable(self) -> bool:
        return False  # the caller's cache_len and kv_compact decide what stays

    def empty(self) -> bool:
        return False

    def size(self) -> int:
        return self.keys.shape[2]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class MLXLMTarget(ConfigSizes, TreeForward):
    """MLX target protocol (``redrafter_ext.mlx.models``) over an unchanged mlx-lm Llama ``Model``.

    ``config`` is the model's ``ModelArgs`` (``vocab_size``, ``hidden_size``,
    ``max_position_embeddings``); ``eos_token_id`` and ``tokenizer`` (mlx-lm's ``TokenizerWrapper``)
    are set by ``from_pretrained`` (None otherwise).
    """

    def __init__(self, model: nn.Module) -> None:
        module = type(model).__module__
        if module != _LLAMA_MODULE:
            kind = getattr(model, "model_type", None) or getattr(getattr(model, "args", None), "model_type", None)
            raise ValueError(
                f"MLXLMTarget: supports mlx-lm's Llama models ({_LLAMA_MODULE}.Model: model_type in "
                f"{supported_model_types()}), got {module}.{type(model).__name__} (model_type {kind!r})")
        layers = model.layers
        sliding = [i for i, layer in enumerate(layers) if getattr(layer, "use_sliding", False)]
        if sliding:
            raise ValueError(f"MLXLMTarget: layers {sliding} use sliding-window attention, which the tree mask "
                             "does not model; only full attention in every layer is supported")
        for layer in layers:
            a = layer.self_attn
            if not isinstance(a.rope, TokenRoPE):  # idempotent: a second adapter reuses the wrapper
                a.rope = TokenRoPE(a.rope)
        self.model = model
        self.config = model.args
        a = layers[0].self_attn
        self._n_layers, self._n_kv, self._head_dim = len(layers), a.n_kv_heads, a.head_dim
        self.tokenizer = None
        self.eos_token_id: int | None = None
        emb = model.model.embed_tokens
        if isinstance(emb, nn.QuantizedEmbedding):
            # the drafter looks tokens up in a float (V, H) table: dequantize once, not per step
            self._embed = mx.dequantize(emb["weight"], scales=emb["scales"], biases=emb.get("biases"),
                                        group_size=emb.group_size, bits=emb.bits, mode=emb.mode)
            mx.eval(self._embed)
        else:
            self._embed = None

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: mx.Dtype | None = mx.float32) -> MLXLMTarget:
        """``mlx_lm.load`` of a local model folder (no hub access), then cast to ``dtype``.

        ``folder``: ``config.json`` (a ``model_type`` mlx-lm loads as Llama) + ``model*.safetensors`` +
        tokenizer files, as Hugging Face or ``mlx_lm.convert`` write them. ``dtype``: the floating
        parameters' dtype (default float32, as ``LlamaTarget``; None keeps the checkpoint's).
        """
        who = "MLXLMTarget.from_pretrained"
        path = Path(folder)
        if not path.is_dir():
            raise FileNotFoundError(f"{who}: folder {str(folder)!r} does not exist; give a local model folder "
                                    "(no hub download here)")
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{who}: folder {str(folder)!r} has no config.json: not an mlx-lm model folder")
        try:
            config = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{who}: {cfg_file} is not valid JSON: {e}") from e
        kind = config.get("model_type") if isinstance(config, dict) else None
        if kind not in supported_model_types():
            raise ValueError(f"{who}: {cfg_file} has model_type {kind!r}; MLXLMTarget supports mlx-lm's Llama "
                             f"architecture, model_type in {supported_model_types()}")
        if not any(path.glob("model*.safetensors")):
            raise FileNotFoundError(f"{who}: folder {str(folder)!r} has no model*.safetensors weights")
        import mlx_lm

        model, tokenizer, cfg = mlx_lm.load(str(path), model_config=_rope_overrides(config), return_config=True)
        if dtype is not None:
            model.set_dtype(dtype)
        target = cls(model)
        target.tokenizer = tokenizer
        eos = cfg.get("eos_token_id")
        target.eos_token_id = eos[0] if isinstance(eos, list) and eos else eos if isinstance(eos, int) else None
        return target

    # -- protocol (vocab_size, hidden_size: ConfigSizes) ----------------------------------------
    @property
    def embed_weight(self) -> mx.array:
        """``(V, H)``: the input embedding table (dequantized when the model is quantized)."""
        return self._embed if self._embed is not None else self.model.model.embed_tokens.weight

    @property
    def dtype(self) -> mx.Dtype:
        """The compute dtype of hidden states and K/V (the final norm's weight dtype)."""
        return self.model.model.norm.weight.dtype

    def new_kv_cache(self, batch: int, max_len: int, dtype: mx.Dtype | None = None) -> mx.array:
        """Zeroed cache ``(n_layers, 2, batch, n_kv_heads, max_len, head_dim)`` in the model dtype."""
        shape = (self._n_layers, 2, batch, self._n_kv, max_len, self._head_dim)
        return mx.zeros(shape, dtype=dtype or self.dtype)

    def _check(self, op: str, tokens: mx.array, positions: mx.array, tree_mask: mx.array, cache_len: mx.array,
               kv: mx.array, lengths: mx.array | None = None) -> None:
        """Metadata checks (types, shapes, dtypes; no values are read)."""
        if lengths is not None:
            check_array(op, "lengths", lengths, "B", INT_DTYPES)
        check_array(op, "tokens", tokens, "B, T", INT_DTYPES)
        B, T = tokens.shape
        check_array(op, "positions", positions, "B, T", INT_DTYPES)
        check_array(op, "tree_mask", tree_mask, "B, T, T", (mx.bool_,))
        check_array(op, "cache_len", cache_len, "B", INT_DTYPES)
        check_array(op, "kv", kv, "n_layers, 2, B, H_kv, S, D", FLOAT_DTYPES)
        for name, a, want in (("positions", positions, (B, T)), ("tree_mask", tree_mask, (B, T, T)),
                              ("cache_len", cache_len, (B,))):
            if tuple(a.shape) != want:
                raise ValueError(f"{op}: {name} must have shape {want} (tokens is {(B, T)}), got {tuple(a.shape)}")
        S = kv.shape[4]
        want = (self._n_layers, 2, B, self._n_kv, S, self._head_dim)
        if tuple(kv.shape) != want:
            raise ValueError(f"{op}: kv must have shape (n_layers, 2, B, H_kv, S, D) = {want}, got {tuple(kv.shape)}")
        if kv.dtype != self.dtype:
            # the cache slices go straight into mlx-lm's attention next to the model's queries
            raise TypeError(f"{op}: kv dtype {kv.dtype} must equal the model dtype {self.dtype}")
        if S < T:
            raise ValueError(f"{op}: kv has S = {S} cache slots, fewer than the T = {T} tokens of this forward "
                             "(a row needs cache_len + T <= S)")

    def _body(self, tokens: mx.array, positions: mx.array, tree_mask: mx.array, cache_len: mx.array,
              kv: mx.array) -> tuple[mx.array, mx.array]:
        """Hidden states ``(B, T, H)`` after the final norm, and the cache with the new K/V written."""
        B, T = tokens.shape
        S = kv.shape[4]
        mask = tree_visibility(tree_mask, cache_len, S)[:, None]  # [B, 1, T, S], broadcast over heads
        # clamped like LlamaTarget's write: a row without room gives wrong numbers, never a foreign slot
        slots = mx.clip(cache_len.astype(mx.int32)[:, None] + mx.arange(T, dtype=mx.int32)[None, :], 0, S - 1)
        slots = mx.broadcast_to(slots[:, None, :, None], (B, self._n_kv, T, self._head_dim))
        caches = [TreeKVCache(kv[i, 0], kv[i, 1], slots, positions, mask) for i in range(self._n_layers)]
        hidden = self.model.model(tokens, cache=caches)
        kv = mx.stack([mx.stack([c.keys, c.values]) for c in caches])
        return hidden, kv

    def _head(self, hidden: mx.array) -> mx.array:
        # mlx-lm's Model.__call__ head, applied here because model.model gives the hidden state we need
        m = self.model
        if m.args.tie_word_embeddings:
            logits = m.model.embed_tokens.as_linear(hidden)
        else:
            logits = m.lm_head(hidden)
        return logits.astype(mx.float32)


def _rope_overrides(config: dict) -> dict:
    """mlx-lm 0.32's Llama reads ``rope_theta`` / ``rope_scaling`` at the top level of config.json
    only; transformers >= 5 writes them inside ``rope_parameters`` (SmolLM2's converted folder), where
    mlx-lm would silently fall back to theta 10000. Carry them over as ``mlx_lm.load`` overrides."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict):
        return {}
    out = {}
    if "rope_theta" not in config and "rope_theta" in rope:
        out["rope_theta"] = rope["rope_theta"]
    if rope.get("rope_type", rope.get("type", "default")) != "default" and config.get("rope_scaling") is None:
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return out
