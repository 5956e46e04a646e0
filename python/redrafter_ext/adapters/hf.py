"""A Hugging Face ``transformers`` ``LlamaForCausalLM`` as the target of ``decode_step``.

    from redrafter_ext.adapters.hf import HFTarget
    target = HFTarget.from_pretrained(folder)          # or HFTarget(LlamaForCausalLM instance)
    out = redrafter_ext.generate(target, drafter, prompts, 64, beam_width=1, beam_length=8)

The adapter implements the target protocol of ``redrafter_ext.models`` without touching the HF
model code: each ``forward`` hands HF
  * explicit ``position_ids`` ``(B, T)`` (tree depth + cache length),
  * a custom 4D additive mask ``(B, 1, T, S)`` (0 where visible, ``finfo.min`` elsewhere): slot s
    is visible from tree node t when ``s < cache_len[b]`` or ``s = cache_len[b] + j`` with
    ``tree_mask[b, t, j]``; HF's mask builder returns a 4D mask as is,
  * a ``transformers.Cache`` whose layer i holds *views* ``kv[i, 0]`` / ``kv[i, 1]`` of the
    caller-owned cache; its ``update`` scatters the T new K/V rows to slots ``cache_len[b] + t``
    in place and returns the full ``(B, H_kv, S, D)`` views, so the tree write lands in the
    caller's tensor and nothing is concatenated.

Cost per forward on top of the HF model's own compute (B rows, T tree nodes, S cache slots,
n layers, Hq query heads, Hkv KV heads, head dim D; measured by ``tests/test_hf_adapter.py``):
  * mask build, once per forward: one bool ``(B, T, S)`` gather + one ``(B, 1, T, S)`` additive
    mask in the model dtype (shared by all layers);
  * tree write, per layer: ``scatter_`` of ``2 * B * Hkv * T * D`` elements into ``kv`` (the
    write the protocol requires, not a copy of the cache);
  * K/V materialisation, per layer: HF's SDPA integration asks SDPA for GQA only when there is no
    mask, so when ``Hq > Hkv`` and ``T > 1`` it expands K and V with ``repeat_kv`` into two new
    ``(B, Hq, S, D)`` tensors (``2 * B * Hq * S * D`` elements per layer, the dominant extra
    cost). At ``T = 1`` (plain AR steps) HF packs the query heads instead and copies nothing.
    Setting ``TRANSFORMERS_SDPA_FORCE_GQA=1`` makes HF pass ``enable_gqa`` to SDPA and removes
    the copy (the ``eager`` attention always copies);
  * attention runs over all S slots, masked, like ``LlamaTarget`` (fixed shapes);
  * ``tokens``/``positions`` are cast to int64 (``B * T``), and the logits to float32 when the
    model is not float32.
No host synchronisation: no ``.item()``, no data-dependent shapes.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from ..config import ConfigSizes
from ..models import causal_tree_mask, tree_visibility

__all__ = ["HFTarget", "KVViewCache", "tree_attention_mask"]

_ATTN_OK = ("sdpa", "eager")


def tree_attention_mask(tree_mask: Tensor, cache_len: Tensor, S: int, dtype: torch.dtype) -> Tensor:
    """The additive mask HF attention adds to the scores: ``(B, 1, T, S)`` in ``dtype``.

    ``tree_mask (B, T, T)`` bool ancestor-or-self, ``cache_len (B,)`` int. 0 where slot s is visible
    from node t (``s < cache_len`` or an ancestor-or-self in the tree block at ``cache_len..+T-1``),
    ``finfo(dtype).min`` elsewhere (HF's convention: the softmax weight underflows to exactly 0).
    """
    B, T, _ = tree_mask.shape
    visible = tree_visibility(tree_mask, cache_len, S)
    mask = torch.zeros(B, 1, T, S, dtype=dtype, device=tree_mask.device)
    return mask.masked_fill_(~visible[:, None], torch.finfo(dtype).min)


class _KVViewLayer(CacheLayerMixin):
    """One layer: K and V are views ``(B, H_kv, S, D)`` into the caller's cache."""

    is_compileable = False
    is_sliding = False

    def __init__(self, keys: Tensor, values: Tensor, slots: Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.slots = keys, values, slots
        self.device = keys.device
        self.is_initialized = True

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        pass  # the storage is the caller's

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        # in-place index write at cache_len[b] + t; returns the whole views (no concat, no copy)
        self.keys.scatter_(2, self.slots, key_states)
        self.values.scatter_(2, self.slots, value_states)
        return self.keys, self.values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.keys.shape[2], 0

    def get_seq_length(self) -> int:
        # only consulted by HF when position_ids are missing; HFTarget always passes them
        raise NotImplementedError("KVViewCache: per-row cache lengths live in the caller's cache_len tensor")

    def get_max_length(self) -> int:
        return self.keys.shape[2]


class KVViewCache(Cache):
    """A ``transformers.Cache`` over a caller-owned ``(n_layers, 2, B, H_kv, S, D)`` tensor.

    ``cache_len (B,)`` int: per row, the slot of the first of the T new tokens of this forward.
    """

    def __init__(self, kv: Tensor, cache_len: Tensor, T: int) -> None:
        B, Hkv, D = kv.shape[2], kv.shape[3], kv.shape[5]
        pos = cache_len.to(torch.int64)[:, None] + torch.arange(T, device=kv.device)  # [B, T]
        slots = pos[:, None, :, None].expand(B, Hkv, T, D)  # one index shared by every layer (a view)
        super().__init__(layers=[_KVViewLayer(kv[i, 0], kv[i, 1], slots) for i in range(kv.shape[0])])


class HFTarget(ConfigSizes):
    """Target-protocol wrapper of a ``transformers`` ``LlamaForCausalLM`` (or any HF causal LM with
    the same ``model.model`` / ``model.lm_head`` layout and Llama-style attention)."""

    def __init__(self, model) -> None:
        impl = getattr(model.config, "_attn_implementation", None)
        if impl not in _ATTN_OK:
            raise ValueError(
                f"HFTarget: attention implementation {impl!r} cannot take a custom 4D tree mask; "
                f"load the model with attn_implementation in {_ATTN_OK}"
            )
        self.model = model.eval()
        self.config = model.config
        c = model.config
        self._n_layers = c.num_hidden_layers
        self._n_kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        self._head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                        attn_implementation: str = "sdpa") -> HFTarget:
        from transformers import LlamaForCausalLM

        model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
        return cls(model.to(device))

    # -- protocol (vocab_size, hidden_size: ConfigSizes) ----------------------------------------
    @property
    def embed_weight(self) -> Tensor:
        return self.model.get_input_embeddings().weight

    def new_kv_cache(self, batch: int, max_len: int, dtype: torch.dtype | None = None) -> Tensor:
        """Zeroed cache ``(n_layers, 2, batch, n_kv_heads, max_len, head_dim)`` in the model dtype."""
        w = self.embed_weight
        return torch.zeros(self._n_layers, 2, batch, self._n_kv, max_len, self._head_dim,
                           dtype=dtype or w.dtype, device=w.device)

    def _check_kv(self, kv: Tensor) -> None:
        want = (self._n_layers, 2, kv.shape[2], self._n_kv, kv.shape[4], self._head_dim)
        if kv.dim() != 6 or tuple(kv.shape) != want:
            raise ValueError(f"HFTarget: kv must have shape (n_layers, 2, B, H_kv, S, D) = {want}, got {tuple(kv.shape)}")
        if kv.dtype != self.embed_weight.dtype:
            # the cache views go straight into HF attention, which needs K/V in the model dtype
            raise TypeError(f"HFTarget: kv dtype {kv.dtype} must equal the model dtype {self.embed_weight.dtype}")

    @torch.no_grad()
    def forward(self, tokens: Tensor, positions: Tensor, tree_mask: Tensor, cache_len: Tensor,
                kv: Tensor) -> tuple[Tensor, Tensor]:
        """Tree forward (protocol of ``redrafter_ext.models``): writes K/V at ``cache_len + t`` in ``kv``.

        tokens, positions ``(B, T)`` int; tree_mask ``(B, T, T)`` bool; cache_len ``(B,)`` int;
        kv ``(n_layers, 2, B, H_kv, S, D)`` in the model dtype. Returns logits ``(B, T, V)`` float32
        and hidden ``(B, T, H)`` after the final norm.
        """
        self._check_kv(kv)
        T = tokens.shape[1]
        mask = tree_attention_mask(tree_mask, cache_len, kv.shape[4], kv.dtype)
        cache = KVViewCache(kv, cache_len, T)
        out = self.model.model(input_ids=tokens.to(torch.int64), attention_mask=mask,
                               position_ids=positions.to(torch.int64), cache=cache, use_cache=True)
        hidden = out.last_hidden_state
        return self.model.lm_head(hidden).float(), hidden

    __call__ = forward

    def prefill(self, tokens: Tensor, lengths: Tensor, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Right-padded prompts ``(B, T)`` of ``lengths (B,)`` into slots 0..T-1 (as ``LlamaTarget``).

        Returns ``logits (B, V)`` float32 and ``hidden (B, H)`` at each row's last prompt token.
        """
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        cache_len = torch.zeros(B, dtype=torch.int32, device=tokens.device)
        logits, hidden = self.forward(tokens, positions, causal_tree_mask(lengths, T), cache_len, kv)
        last = (lengths.to(torch.int64) - 1)[:, None, None]
        logits = torch.gather(logits, 1, last.expand(B, 1, logits.shape[2]))[:, 0]
        hidden = torch.gather(hidden, 1, last.expand(B, 1, hidden.shape[2]))[:, 0]
        return logits, hidden
