"""Adapters that let other engines' models serve as the ``decode_step`` target.

    from redrafter_ext.adapters.hf import HFTarget      # a transformers LlamaForCausalLM

Each adapter implements the target protocol documented in ``redrafter_ext.models`` (and in
``docs/integration.md``). Adapters import their engine lazily, so importing this package needs
nothing beyond torch.
"""

from __future__ import annotations

__all__ = ["hf"]
