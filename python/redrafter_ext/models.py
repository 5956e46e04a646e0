"""A Llama-architecture target with the static KV cache and tree forward that ``decode_step`` needs.

Architecture (Hugging Face ``LlamaForCausalLM`` compatible): RMSNorm, rotary position embeddings
(rotate-half convention), grouped-query attention, SwiGLU MLP, optional tied embeddings. Loads and
saves a Hugging Face checkpoint folder (``config.json`` + ``model.safetensors``) offline.

KV cache layout (owned by the caller, see ``new_kv_cache``):
    kv: (n_layers, 2, B, n_kv_heads, max_len, head_dim), contiguous, index 0 = K, 1 = V.

The target protocol an engine implements to use ``decode_step`` with its own model:

    class Target(Protocol):
        vocab_size: int
        hidden_size: int
        embed_weight: Tensor                       # (V, H) input embedding, read by the drafter
        def forward(self, tokens, positions, tree_mask, cache_len, kv) -> tuple[Tensor, Tensor]:
            # tokens (B, T) int, positions (B, T) int, tree_mask (B, T, T) bool,
            # cache_len (B,) int32, kv: the cache.
            # Writes the K/V of token t at slot cache_len[b] + t; token t attends to every slot
            # < cache_len[b] and to slot cache_len[b] + j where tree_mask[b, t, j].
            # Returns logits (B, T, V) float32 and hidden (B, T, H) after the final norm.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["LlamaConfig", "LlamaTarget", "causal_tree_mask"]


@dataclass
class LlamaConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int | None = None
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 2048
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"LlamaConfig: num_attention_heads={self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @classmethod
    def from_hf(cls, d: dict) -> LlamaConfig:
        """From a Hugging Face ``config.json`` dict; unsupported features raise."""
        scaling = d.get("rope_scaling")
        if scaling not in (None, {}) and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise NotImplementedError(f"LlamaConfig: rope_scaling {scaling} is not supported")
        for flag in ("attention_bias", "mlp_bias"):
            if d.get(flag):
                raise NotImplementedError(f"LlamaConfig: {flag}=True is not supported")
        if d.get("hidden_act", "silu") != "silu":
            raise NotImplementedError(f"LlamaConfig: hidden_act={d['hidden_act']!r} is not supported")
        rope = d.get("rope_parameters") or {}
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        if "rope_theta" not in kw and "rope_theta" in rope:
            kw["rope_theta"] = rope["rope_theta"]
        kw.setdefault("num_key_value_heads", d["num_attention_heads"])
        eos = kw.get("eos_token_id")
        if isinstance(eos, list):
            kw["eos_token_id"] = eos[0]
        return cls(**kw)

    def to_hf(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                 attention_bias=False, mlp_bias=False, torch_dtype="float32")
        return d


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
        H, D = c.hidden_size, c.head_dim
        self.q_proj = nn.Linear(H, c.num_attention_heads * D, bias=False)
        self.k_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.v_proj = nn.Linear(H, c.num_key_value_heads * D, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * D, H, bias=False)
        self.gate_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, H, bias=False)
        self.input_layernorm = nn.Parameter(torch.ones(H))
        self.post_attention_layernorm = nn.Parameter(torch.ones(H))


# Hugging Face parameter names of one layer, relative to model.layers.{i}.
_HF_LAYER_NAMES = {
    "q_proj.weight": "self_attn.q_proj.weight",
    "k_proj.weight": "self_attn.k_proj.weight",
    "v_proj.weight": "self_attn.v_proj.weight",
    "o_proj.weight": "self_attn.o_proj.weight",
    "gate_proj.weight": "mlp.gate_proj.weight",
    "up_proj.weight": "mlp.up_proj.weight",
    "down_proj.weight": "mlp.down_proj.weight",
    "input_layernorm": "input_layernorm.weight",
    "post_attention_layernorm": "post_attention_layernorm.weight",
}


def causal_tree_mask(lengths: Tensor, T: int) -> Tensor:
    """A chain 'tree' for prefill: ``(B, T, T)`` bool lower-triangular (padding rows included)."""
    tri = torch.ones(T, T, dtype=torch.bool, device=lengths.device).tril()
    return tri.expand(lengths.shape[0], T, T)


class LlamaTarget(nn.Module):
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

    # -- protocol -------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def embed_weight(self) -> Tensor:
        return self.embed_tokens.weight

    def new_kv_cache(self, batch: int, max_len: int, dtype: torch.dtype | None = None) -> Tensor:
        """Zeroed cache ``(n_layers, 2, batch, n_kv_heads, max_len, head_dim)``."""
        c = self.config
        w = self.embed_tokens.weight
        return torch.zeros(
            c.num_hidden_layers, 2, batch, c.num_key_value_heads, max_len, c.head_dim,
            dtype=dtype or w.dtype, device=w.device,
        )

    def forward(
        self, tokens: Tensor, positions: Tensor, tree_mask: Tensor, cache_len: Tensor, kv: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Tree forward: see the module docstring. Fixed shapes, no host synchronisation.

        Returns ``logits (B, T, V)`` float32 and ``hidden (B, T, H)`` (after the final norm).
        """
        c = self.config
        B, T = tokens.shape
        S = kv.shape[4]
        Hq, Hkv, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        x = self.embed_tokens(tokens.to(torch.int64))  # [B, T, H]

        # rotary tables for the explicit positions: [B, 1, T, D]
        freqs = positions.to(torch.float32)[..., None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None].to(x.dtype), emb.sin()[:, None].to(x.dtype)

        # key s is visible from tree node t if s is committed (s < cache_len) or s is an
        # ancestor-or-self of t in the tree block written at cache_len..cache_len+T-1
        base = cache_len.to(torch.int64)
        rel = torch.arange(S, device=tokens.device)[None, :] - base[:, None]  # [B, S]
        in_tree = (rel >= 0) & (rel < T)
        tree = torch.gather(tree_mask, 2, rel.clamp(0, T - 1)[:, None, :].expand(B, T, S))
        visible = ((rel < 0)[:, None, :] | (in_tree[:, None, :] & tree))[:, None]  # [B, 1, T, S]
        slots = (base[:, None] + torch.arange(T, device=tokens.device))[:, None, :, None].expand(B, Hkv, T, D)

        for i, layer in enumerate(self.layers):
            h = _rms_norm(x, layer.input_layernorm, c.rms_norm_eps)
            q = layer.q_proj(h).view(B, T, Hq, D).transpose(1, 2)
            k = layer.k_proj(h).view(B, T, Hkv, D).transpose(1, 2)
            v = layer.v_proj(h).view(B, T, Hkv, D).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kv[i, 0].scatter_(2, slots, k.to(kv.dtype))
            kv[i, 1].scatter_(2, slots, v.to(kv.dtype))
            attn = F.scaled_dot_product_attention(
                q, kv[i, 0].to(q.dtype), kv[i, 1].to(q.dtype), attn_mask=visible, enable_gqa=Hq != Hkv
            )
            x = x + layer.o_proj(attn.transpose(1, 2).reshape(B, T, Hq * D))
            h = _rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps)
            x = x + layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))

        hidden = _rms_norm(x, self.norm, c.rms_norm_eps)
        head = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, head).float(), hidden

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

        folder = Path(folder)
        cfg = folder / "config.json"
        if not cfg.is_file():
            raise FileNotFoundError(f"LlamaTarget.from_pretrained: no config.json in {folder}")
        model = cls(LlamaConfig.from_hf(json.loads(cfg.read_text())))
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"LlamaTarget.from_pretrained: no *.safetensors in {folder}")
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
