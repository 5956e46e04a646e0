"""``LlamaConfig``: the target's architecture, shared by the torch and MLX backends (no torch here,
so ``redrafter_ext.mlx`` imports without torch)."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

__all__ = ["LlamaConfig", "ConfigSizes", "read_checkpoint"]


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

    def layer_linears(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each bias-free projection of one decoder layer, by Hugging Face
        name relative to the layer (``self_attn.q_proj``, ``mlp.gate_proj``, ...)."""
        H, D, inter = self.hidden_size, self.head_dim, self.intermediate_size
        q, kv = self.num_attention_heads * D, self.num_key_value_heads * D
        return {"self_attn.q_proj": (H, q), "self_attn.k_proj": (H, kv), "self_attn.v_proj": (H, kv),
                "self_attn.o_proj": (q, H), "mlp.gate_proj": (H, inter), "mlp.up_proj": (H, inter),
                "mlp.down_proj": (inter, H)}

    def to_hf(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d.update(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
                 attention_bias=False, mlp_bias=False, torch_dtype="float32")
        return d


class ConfigSizes:
    """``vocab_size`` and ``hidden_size`` of the target protocol, read from ``self.config``.

    Shared by every target whose config carries them (the torch and MLX ``LlamaTarget``, the HF adapter).
    """

    config: LlamaConfig

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size


def read_checkpoint(folder: str | Path, who: str) -> tuple[LlamaConfig, list[Path]]:
    """The config and the ``*.safetensors`` files of a Hugging Face Llama folder (``who`` names the
    loader in the errors); loading the tensors is the framework's part."""
    folder = Path(folder)
    cfg = folder / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(f"{who}: no config.json in {folder}")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{who}: no *.safetensors in {folder}")
    return LlamaConfig.from_hf(json.loads(cfg.read_text())), files
