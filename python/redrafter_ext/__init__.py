"""redrafter_ext: ReDrafter speculative decoding with native trie/mask/beam/KV kernels."""

from __future__ import annotations

import torch  # noqa: F401  (the native module has no RPATH to libtorch: load torch first)

from . import ops, reference

__all__ = ["ops", "reference"]
__version__ = "0.1.0"
