"""Adapters that let other engines' models serve as the ``decode_step`` target.

    from redrafter_ext.adapters.hf import HFTarget      # a transformers LlamaForCausalLM

Each adapter implements the target protocol documented in ``redrafter_ext.models`` (and in
``docs/integration.md``). Adapters import their engine lazily, so importing this package needs
nothing beyond torch.
"""

from __future__ import annotations

import importlib

__all__ = ["hf"]


def __getattr__(name: str):
    # `rx.adapters.hf` works without a separate import, and importing redrafter_ext stays cheap
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
