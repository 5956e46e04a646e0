"""Linear layers at few rows on the CPU: packed weights for ``skinny_linear``, column-major copies.

A decode step multiplies 1 row by each weight, a tree verify N (= 1 + W*(L-1)) rows, a beam step
of the drafter B*W: with up to ``SKINNY_MAX_ROWS`` rows the native ``skinny_linear`` streams a
packed copy of the weight once, where MKL's GEMM repacks it every call (measured here, fp32, 1
thread, 1536 x 576: 4 rows cost 1.1x one row against 1.8x; docs/native_cpu_kernels.md). It also
sums each output in a fixed order, so a verify's linears match a one-token step's bit for bit.

Copies are attributes of the ``nn.Linear`` (or tied ``nn.Embedding``) they mirror, held with the
source tensor and its version: after ``.to()`` or an in-place update they go stale and are ignored
(call ``pack_weights`` again to refresh). Used by ``LlamaTarget`` and ``Drafter``.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Rows up to which a packed weight is used, measured (fp32, 1 thread, 576 x 1536) against MKL's
# GEMM: with AVX-512 it wins up to ~32 rows (Xeon, Zen 5); with AVX2 (an 8-lane kernel) up to 4-8
# rows, and loses 1.2x from 16 (Zen 1).
SKINNY_MAX_ROWS = 32 if getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")().startswith("AVX512") else 8


def _current(copy: tuple, w: Tensor) -> bool:
    """Whether a weight copy ``(copy, source, version)`` still mirrors ``w``. The copy holds its
    source's tensor, so the storage cannot be freed and its address reused by a later ``.to()``."""
    return copy[1].data_ptr() == w.data_ptr() and copy[2] == w._version


def pack_weights(modules: Iterable[nn.Module], enabled: bool = True) -> None:
    """Give each module (``.weight (N, K)``) a packed float32 copy for ``skinny_linear``.

    Float32 CPU weights only: elsewhere, or without the native module, ``linear`` runs ``F.linear``.
    The copies take the weights' memory again.
    """
    try:
        from .ops import skinny_linear, skinny_pack  # noqa: F401  (skinny_linear: the native kernel is there)
    except ImportError:  # no native module: F.linear everywhere
        enabled = False
    for m in modules:
        w = m.weight.detach()
        ok = enabled and w.device.type == "cpu" and w.dtype == torch.float32
        m._packed = (skinny_pack(w), w, w._version) if ok else None


def column_major_copies(modules: Iterable[nn.Module], enabled: bool = True) -> None:
    """Give each module a column-major copy of its weight for forwards of more rows than the packed
    copies serve: ``F.linear`` of 48 rows over row-major fp32 weights (MKL, 1 thread, 576 x 1536)
    costs 1.6x the same over column-major ones (the GEMM packs a row-major weight each call)."""
    for m in modules:
        w = m.weight.detach()
        m._colmajor = (w.t().contiguous().t(), w, w._version) if enabled else None


def linear(x: Tensor, m: nn.Module) -> Tensor:
    """``x (..., K) @ m.weight (N, K)^T (+ m.bias)`` -> ``(..., N)`` in ``x``'s dtype, over the
    module's packed copy (few rows, no gradient asked), its column-major copy, or ``F.linear``."""
    w, bias = m.weight, getattr(m, "bias", None)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    # the native op has no backward: only where no gradient is asked for
    if rows <= SKINNY_MAX_ROWS and not (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)):
        p = getattr(m, "_packed", None)
        if p is not None and _current(p, w) and x.dtype == torch.float32:
            y = torch.ops.redrafter.skinny_linear(x.reshape(rows, x.shape[-1]), p[0], w.shape[0], bias)
            return y.view(*x.shape[:-1], w.shape[0])
    c = getattr(m, "_colmajor", None)
    if rows > 1 and c is not None and _current(c, w) and c[0].dtype == w.dtype:
        return F.linear(x, c[0], bias)
    return F.linear(x, w, bias)
