"""Adapters that let other MLX engines' models serve as the ``redrafter_ext.mlx.decode_step`` target.

    from redrafter_ext.mlx.adapters.mlx_lm import MLXLMTarget   # an mlx-lm Llama model, unchanged

Each adapter implements the MLX target protocol documented in ``redrafter_ext.mlx.models``.
Adapters import their engine lazily, so importing this package needs nothing beyond mlx.
"""

from __future__ import annotations

import importlib

__all__ = ["mlx_lm"]


def __getattr__(name: str):
    # `rxm.adapters.mlx_lm` works without a separate import; mlx-lm (and transformers) load only then
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
