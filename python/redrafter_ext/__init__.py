"""redrafter_ext: ReDrafter speculative decoding with native trie/mask/beam/KV kernels.

    import redrafter_ext as rx
    target, drafter, tok = rx.load_model("smollm2-135m-instruct")   # or "tiny", or a HF Llama folder
    ids = tok.apply_chat_template([{"role": "user", "content": "Why is the sky blue?"}], add_generation_prompt=True)
    out = rx.generate(target, drafter, [ids], max_new_tokens=64, beam_width=1, beam_length=8, eos_id=2)
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
    from .hub import load_model
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
        "load_model",
    ]
__version__ = "0.1.0"
