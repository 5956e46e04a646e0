"""redrafter_ext: ReDrafter speculative decoding with native trie/mask/beam/KV kernels.

    from redrafter_ext import LlamaTarget, Drafter, generate, autoregressive_generate
    target = LlamaTarget.from_pretrained(folder); drafter = Drafter.from_pretrained(folder2)
    out = generate(target, drafter, [[1, 2, 3]], max_new_tokens=64, beam_width=4, beam_length=4)
"""

from __future__ import annotations

from importlib.util import find_spec

from .config import LlamaConfig

__all__ = ["LlamaConfig"]

# The torch backend is optional so that an MLX-only install (macOS without torch) can still
# `import redrafter_ext.mlx`; with torch present everything below is exported as before.
if find_spec("torch") is not None:
    import torch  # noqa: F401  (the native module has no RPATH to libtorch: load torch first)

    from . import adapters, ops, reference
    from .decode import DecodeState, GenerateOutput, SamplingParams, autoregressive_generate, decode_step, generate
    from .drafter import Drafter, DrafterConfig, beam_search
    from .models import LlamaTarget, PagedKV
    from .policy import SpeculationPolicy
    from .serving import Batch, BlockPool

    __all__ += [
        "adapters",
        "ops",
        "reference",
        "DecodeState",
        "GenerateOutput",
        "SamplingParams",
        "decode_step",
        "generate",
        "autoregressive_generate",
        "Drafter",
        "DrafterConfig",
        "beam_search",
        "LlamaTarget",
        "PagedKV",
        "SpeculationPolicy",
        "Batch",
        "BlockPool",
    ]
__version__ = "0.1.0"
