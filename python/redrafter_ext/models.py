"""A Llama-architecture target with the static KV cache and tree forward that ``decode_step`` needs.

Architecture (Hugging Face ``LlamaForCausalLM`` compatible): RMSNorm, rotary position embeddings
(rotate-half convention), grouped-query attention, SwiGLU MLP, optional tied embeddings. Loads and
saves a Hugging Face checkpoint folder (``config.json`` + ``model.safetensors``) offline.

KV cache layouts (owned by the caller):
    contiguous (``new_kv_cache``): kv (n_layers, 2, B, n_kv_heads, max_len, head_dim), index 0 = K, 1 = V.
    paged (``new_paged_kv_cache``, ``PagedKV``): pages (n_layers, num_blocks, 2, n_kv_heads,
        block_size, head_dim) + block_table (B, max_blocks) int32; logical slot s of row b is
        block block_table[b, s // block_size], offset s % block_size (see docs/paged_kv.md).

The target protocol an engine implements to use ``decode_step`` with its own model:

    class Target(Protocol):
        vocab_size: int
        hidden_size: int
        embed_weight: Tensor                       # (V, H) input embedding, read by the drafter
        def forward(self, tokens, positions, tree_mask, cache_len, kv) -> tuple[Tensor, Tensor]:
            # tokens (B, T) int, positions (B, T) int, tree_mask (B, T, T) bool,
            # cache_len (B,) int32, kv: the cache (a Tensor, or a PagedKV for a paged cache).
            # Writes the K/V of token t at slot cache_len[b] + t; token t attends to every slot
            # < cache_len[b] and to slot cache_len[b] + j where tree_mask[b, t, j].
            # Returns logits (B, T, V) float32 and hidden (B, T, H) after the final norm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ConfigSizes, LlamaConfig, read_checkpoint
from .few_rows import column_major_copies, linear, pack_weights

__all__ = ["LlamaConfig", "LlamaTarget", "PagedKV", "causal_tree_mask", "tree_visibility"]


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # computed in float32 and cast back before the weight, as Hugging Face does
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _Layer(nn.Module):
    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        for name, (n_in, n_out) in c.layer_linears().items():  # flat: q_proj, ..., down_proj
            setattr(self, name.split(".")[1], nn.Linear(n_in, n_out, bias=False))
        self.input_layernorm = nn.Parameter(torch.ones(c.hidden_size))
        self.post_attention_layernorm = nn.Parameter(torch.ones(c.hidden_size))


# Hugging Face parameter names of one layer, relative to model.layers.{i}.
_HF_LAYER_NAMES = {
    **{f"{n.split('.')[1]}.weight": f"{n}.weight" for n in LlamaConfig().layer_linears()},
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
}


def causal_tree_mask(lengths: Tensor, T: int) -> Tensor:
    """A chain 'tree' for prefill: ``(B, T, T)`` bool lower-triangular (padding rows included)."""
    tri = torch.ones(T, T, dtype=torch.bool, device=lengths.device).tril()
    return tri.expand(lengths.shape[0], T, T)


def tree_visibility(tree_mask: Tensor, cache_len: Tensor, S: int) -> Tensor:
    """Which of S cache slots each tree node attends to: ``(B, T, S)`` bool.

    ``tree_mask (B, T, T)`` bool ancestor-or-self, ``cache_len (B,)`` int. Slot s is visible from
    node t if it is committed (``s < cache_len``) or an ancestor-or-self of t in the tree block
    written at ``cache_len .. cache_len+T-1``.
    """
    B, T, _ = tree_mask.shape
    rel = torch.arange(S, device=tree_mask.device)[None, :] - cache_len.to(torch.int64)[:, None]  # [B, S]
    in_tree = (rel >= 0) & (rel < T)
    tree = torch.gather(tree_mask, 2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, S))
    return (rel < 0)[:, None, :] | (in_tree[:, None, :] & tree)


@dataclass
class PagedKV:
    """A paged (vLLM-style) KV cache: fixed-size blocks shared by all rows, one block table per row.

    pages        (n_layers, num_blocks, 2, n_kv_heads, block_size, head_dim), contiguous; index 0 of
                 dim 2 is K, 1 is V. Layers are stacked so that ``kv_compact_paged`` moves every
                 layer in one call. Unwritten slots must hold finite values (zeros): a masked key
                 still multiplies its value by 0 in attention, and 0 * NaN is NaN.
    block_table  (B, max_blocks) int32: logical slot s of row b lives in physical block
                 ``block_table[b, s // block_size]`` at offset ``s % block_size``. Entries past a
                 row's used slots may be anything (they are clamped when read and never written).
    max_len      the logical length S each row attends over (default ``max_blocks * block_size``);
                 decode results equal the contiguous cache's of the same S exactly.

    The engine may change ``block_table`` in place between steps (new blocks as a row grows); the
    blocks of slots a step writes must belong to that row alone.
    """

    pages: Tensor
    block_table: Tensor
    max_len: int | None = None

    def __post_init__(self) -> None:
        op = "PagedKV"
        if not isinstance(self.pages, Tensor) or self.pages.dim() != 6 or self.pages.shape[2] != 2:
            shape = tuple(self.pages.shape) if isinstance(self.pages, Tensor) else type(self.pages).__name__
            raise ValueError(f"{op}: pages must have shape (n_layers, num_blocks, 2, H_kv, block_size, D), got {shape}")
        if not isinstance(self.block_table, Tensor) or self.block_table.dim() != 2:
            raise ValueError(f"{op}: block_table must be a (B, max_blocks) int32 tensor")
        if self.block_table.dtype != torch.int32:
            raise TypeError(f"{op}: block_table must have dtype int32, got {self.block_table.dtype}")
        if self.block_table.device != self.pages.device:
            raise ValueError(f"{op}: block_table is on {self.block_table.device} but pages is on {self.pages.device}")
        cap = self.capacity
        if self.max_len is not None and not 1 <= self.max_len <= cap:
            raise ValueError(f"{op}: max_len={self.max_len} must be in [1, max_blocks * block_size = {cap}]")

    @property
    def block_size(self) -> int:
        return self.pages.shape[4]

    @property
    def num_blocks(self) -> int:
        return self.pages.shape[1]

    @property
    def batch(self) -> int:
        return self.block_table.shape[0]

    @property
    def capacity(self) -> int:
        """Logical slots a row can address: ``max_blocks * block_size``."""
        return self.block_table.shape[1] * self.block_size

    @property
    def length(self) -> int:
        """S: the logical slots each row attends over."""
        return self.max_len if self.max_len is not None else self.capacity

    @property
    def dtype(self) -> torch.dtype:
        return self.pages.dtype

    @property
    def device(self) -> torch.device:
        return self.pages.device

    def block_of(self, slots: Tensor, *, for_write: bool = False) -> tuple[Tensor, Tensor]:
        """Physical ``(block, offset)`` int64 of logical ``slots`` (B, T) of each row.

        Reads clamp block ids into range (unused table entries may hold anything; what is read
        there is masked out). Writes do not: an id outside ``[0, num_blocks)`` (negative ones
        included) makes the indexing fail instead of corrupting another block.
        """
        bs = self.block_size
        blocks = torch.gather(self.block_table, 1, slots // bs).to(torch.int64)
        if for_write:
            blocks = torch.where(blocks < 0, self.num_blocks, blocks)
        else:
            blocks = blocks.clamp(0, self.num_blocks - 1)
        return blocks, slots % bs

    def to_contiguous(self) -> Tensor:
        """A contiguous copy ``(n_layers, 2, B, H_kv, S, D)`` of every row's S logical slots."""
        slots = torch.arange(self.length, device=self.device).expand(self.batch, self.length)
        blk, off = self.block_of(slots)
        g = self.pages[:, blk, :, :, off]  # [B, S, n_layers, 2, H, D]
        return g.permute(2, 3, 0, 4, 1, 5).contiguous()


class LlamaTarget(ConfigSizes, nn.Module):
    """Llama causal LM with an explicit, caller-owned KV cache and tree attention."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = nn.Parameter(torch.ones(c.hidden_size))
        self.lm_head = None if c.tie_word_embeddings else nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    # -- protocol (vocab_size, hidden_size: ConfigSizes) ----------------------------------------
    @property
    def embed_weight(self) -> Tensor:
        return self.embed_tokens.weight

    # -- small-batch layouts ---------------------------------------------------------------------
    def use_packed_weights(self, enabled: bool = True) -> LlamaTarget:
        """Keep a packed copy of every layer weight and the LM head for forwards of few rows
        (float32, CPU; ``few_rows.pack_weights``). Call again after ``.to()`` to refresh."""
        pack_weights(self._linears(), enabled)
        return self

    def use_column_major_copies(self, enabled: bool = True) -> LlamaTarget:
        """Keep a column-major copy of every layer weight for forwards of more rows than the packed
        copies serve, e.g. a tree verify of a large batch (``few_rows.column_major_copies``)."""
        column_major_copies(self._linears(), enabled)
        return self

    def _linears(self) -> list[nn.Module]:
        mods = [m for layer in self.layers for m in layer.children() if isinstance(m, nn.Linear)]
        mods.append(self.embed_tokens if self.lm_head is None else self.lm_head)  # the LM head
        return mods

    def new_kv_cache(self, batch: int, max_len: int, dtype: torch.dtype | None = None) -> Tensor:
        """Zeroed cache ``(n_layers, 2, batch, n_kv_heads, max_len, head_dim)``."""
        c = self.config
        w = self.embed_tokens.weight
        return torch.zeros(
            c.num_hidden_layers, 2, batch, c.num_key_value_heads, max_len, c.head_dim,
            dtype=dtype or w.dtype, device=w.device,
        )

    def new_paged_kv_cache(
        self, batch: int, max_len: int, block_size: int, *, num_blocks: int | None = None,
        block_table: Tensor | None = None, dtype: torch.dtype | None = None,
    ) -> PagedKV:
        """Zeroed ``PagedKV`` whose rows attend over ``max_len`` slots in blocks of ``block_size``.

        ``block_table`` (B, ceil(max_len / block_size)) int32 defaults to the identity layout
        (row b owns blocks ``b*max_blocks ..``); ``num_blocks`` defaults to what the table uses.
        """
        c = self.config
        w = self.embed_tokens.weight
        if block_size < 1 or max_len < 1:
            raise ValueError(f"new_paged_kv_cache: block_size={block_size} and max_len={max_len} must be >= 1")
        max_blocks = -(-max_len // block_size)
        if block_table is None:
            block_table = torch.arange(batch * max_blocks, dtype=torch.int32, device=w.device).view(batch, max_blocks)
        if tuple(block_table.shape) != (batch, max_blocks):
            raise ValueError(f"new_paged_kv_cache: block_table must have shape (B, max_blocks) = "
                             f"({batch}, {max_blocks}), got {tuple(block_table.shape)}")
        if num_blocks is None:
            num_blocks = int(block_table.max()) + 1 if block_table.numel() else 1  # sync-ok: allocation time
        pages = torch.zeros(
            c.num_hidden_layers, num_blocks, 2, c.num_key_value_heads, block_size, c.head_dim,
            dtype=dtype or w.dtype, device=w.device,
        )
        return PagedKV(pages, block_table.to(device=w.device, dtype=torch.int32), max_len)

    def forward(
        self, tokens: Tensor, positions: Tensor, tree_mask: Tensor, cache_len: Tensor, kv: Tensor | PagedKV
    ) -> tuple[Tensor, Tensor]:
        """Tree forward: see the module docstring. Fixed shapes, no host synchronisation.

        ``kv`` is the contiguous cache tensor or a ``PagedKV``. Paged: the T new K/V go straight to
        their blocks (one index_put per layer for K and one for V); attention then reads each row's S
        logical slots through a gather into a contiguous ``(B, H_kv, S, D)`` K and V per layer (the
        only copies the paged layout adds; the contiguous cache is read in place).

        Returns ``logits (B, T, V)`` float32 and ``hidden (B, T, H)`` (after the final norm).
        """
        c = self.config
        B, T = tokens.shape
        paged = isinstance(kv, PagedKV)
        S = kv.length if paged else kv.shape[4]
        Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        x = self.embed_tokens(tokens.to(torch.int64))  # [B, T, H]

        # rotary tables for the explicit positions: [B, 1, T, D]
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None].to(x.dtype), emb.sin()[:, None].to(x.dtype)

        visible = tree_visibility(tree_mask, cache_len, S)[:, None]  # [B, 1, T, S]
        base = cache_len.to(torch.int64)
        new_slots = base[:, None] + torch.arange(T, device=tokens.device)  # [B, T]
        if paged:
            # physical (block, offset) of the T written slots and of the S attended slots; the head
            # index broadcasts so that one advanced index yields (B, H_kv, T or S) directly
            heads = torch.arange(Hkv, device=tokens.device)[None, :, None]
            w_blk, w_off = (t[:, None, :] for t in kv.block_of(new_slots, for_write=True))
            r_blk, r_off = (t[:, None, :] for t in kv.block_of(torch.arange(S, device=tokens.device).expand(B, S)))
        else:
            slots = new_slots[:, None, :, None].expand(B, Hkv, T, D)

        lin = linear
        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_layernorm, c.rms_norm_eps)
            q = lin(h, layer.q_proj).view(B, T, Hq, D).transpose(1, 2)
            k = lin(h, layer.k_proj).view(B, T, Hkv, D).transpose(1, 2)
            v = lin(h, layer.v_proj).view(B, T, Hkv, D).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            if paged:
                # fresh views (num_blocks, H_kv, bs, D) per use: autograd rejects an in-place write
                # through a view taken before another write to the same pages
                kv.pages[i, :, 0][w_blk, heads, w_off] = k.to(kv.dtype)
                kv.pages[i, :, 1][w_blk, heads, w_off] = v.to(kv.dtype)
                keys = kv.pages[i, :, 0][r_blk, heads, r_off]  # (B, H_kv, S, D)
                values = kv.pages[i, :, 1][r_blk, heads, r_off]
            else:
                kv[i, 0].scatter_(2, slots, k.to(kv.dtype))
                kv[i, 1].scatter_(2, slots, v.to(kv.dtype))
                keys, values = kv[i, 0], kv[i, 1]
            attn = F.scaled_dot_product_attention(
                q, keys.to(q.dtype), values.to(q.dtype), attn_mask=visible, enable_gqa=Hq != Hkv
            )
            x = x + lin(attn.transpose(1, 2).reshape(B, T, Hq * D), layer.o_proj)
            h = _rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps)
            x = x + lin(F.silu(lin(h, layer.gate_proj)) * lin(h, layer.up_proj), layer.down_proj)

        hidden = _rms_norm(x, self.norm, c.rms_norm_eps)
        head = self.embed_tokens if self.lm_head is None else self.lm_head
        logits = linear(hidden, head)
        return logits.float(), hidden

    def prefill(self, tokens: Tensor, lengths: Tensor, kv: Tensor) -> tuple[Tensor, Tensor]:
        """Run right-padded prompts ``tokens (B, T)`` of ``lengths (B,)`` into slots 0..T-1 of ``kv``.

        Padding positions are written too but lie at or beyond ``lengths``, which becomes the cache
        length, so they are never attended to and are overwritten by the first tree.
        Returns ``logits (B, V)`` and ``hidden (B, H)`` at each row's last prompt token.
        """
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        cache_len = torch.zeros(B, dtype=torch.int32, device=tokens.device)
        logits, hidden = self.forward(tokens, positions, causal_tree_mask(lengths, T), cache_len, kv)
        last = (lengths.to(torch.int64) - 1)[:, None]
        logits = torch.gather(logits, 1, last[:, :, None].expand(B, 1, logits.shape[2]))[:, 0]
        hidden = torch.gather(hidden, 1, last[:, :, None].expand(B, 1, hidden.shape[2]))[:, 0]
        return logits, hidden

    # -- checkpoints ----------------------------------------------------------------------------
    def _hf_names(self) -> dict[str, str]:
        """Our parameter name -> Hugging Face name."""
        out = {"embed_tokens.weight": "model.embed_tokens.weight", "norm": "model.norm.weight"}
        for i in range(self.config.num_hidden_layers):
            for ours, theirs in _HF_LAYER_NAMES.items():
                out[f"layers.{i}.{ours}"] = f"model.layers.{i}.{theirs}"
        if self.lm_head is not None:
            out["lm_head.weight"] = "lm_head.weight"
        return out

    @classmethod
    def from_pretrained(
        cls, folder: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
    ) -> LlamaTarget:
        """Load a Hugging Face Llama checkpoint folder (config.json + *.safetensors), offline."""
        from safetensors.torch import load_file

        config, files = read_checkpoint(folder, "LlamaTarget.from_pretrained")
        model = cls(config)
        weights: dict[str, Tensor] = {}
        for f in files:
            weights.update(load_file(str(f)))
        state = {}
        for ours, theirs in model._hf_names().items():
            if theirs not in weights:
                raise KeyError(f"LlamaTarget.from_pretrained: {folder} lacks weight {theirs!r}")
            state[ours] = weights[theirs]
        model.load_state_dict(state, strict=True)
        return model.to(device=device, dtype=dtype).eval()

    def save_pretrained(self, folder: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write a Hugging Face checkpoint folder that ``transformers`` and this class both load."""
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        own = self.state_dict()
        tensors = {theirs: own[ours].to(dtype or own[ours].dtype).contiguous() for ours, theirs in self._hf_names().items()}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        d = self.config.to_hf()
        if dtype is not None:
            d["torch_dtype"] = str(dtype).replace("torch.", "")
        (folder / "config.json").write_text(json.dumps(d, indent=2) + "\n")
