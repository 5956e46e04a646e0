"""redrafter_ext.mlx: ReDrafter speculative decoding on MLX (Apple silicon GPU, or the CPU).

    from redrafter_ext.mlx import LlamaTarget, Drafter, generate
    target = LlamaTarget.from_pretrained(folder); drafter = Drafter.from_pretrained(folder2)
    out = generate(target, drafter, [[1, 2, 3]], max_new_tokens=64, beam_width=4, beam_length=4)

The ops (the decode step's six and ``ngram_lookup``) come from ``redrafter_ext.mlx.ops`` (native
MLX primitives) when its compiled extension is present, else from ``redrafter_ext.mlx.reference``
(pure ``mlx.core``, same semantics); importing this package never requires the native extension.

Other engines' models as the target: ``redrafter_ext.mlx.adapters.mlx_lm.MLXLMTarget`` (an mlx-lm
Llama model, unchanged; mlx-lm is imported only when that module is).
"""

from __future__ import annotations

from . import adapters, reference
from .decode import (
    DecodeState,
    GenerateOutput,
    SamplingParams,
    autoregressive_generate,
    decode_step,
    default_ops,
    generate,
    native_ops,
)
from .drafter import Drafter, beam_search
from .models import LlamaConfig, LlamaTarget, causal_tree_mask, tree_visibility

__all__ = [
    "adapters",
    "reference",
    "DecodeState",
    "GenerateOutput",
    "SamplingParams",
    "decode_step",
    "default_ops",
    "native_ops",
    "generate",
    "autoregressive_generate",
    "Drafter",
    "beam_search",
    "LlamaConfig",
    "LlamaTarget",
    "causal_tree_mask",
    "tree_visibility",
]
