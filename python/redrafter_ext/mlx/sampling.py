"""The sampling distribution and inverse-CDF sampling on MLX (``redrafter_ext.sampling``'s arithmetic).

Used by ``mlx.decode.SamplingParams`` and the oracle ``mlx.reference.verify_sample`` alike. Both
compute in float64, which MLX supports on the CPU only: they run on the CPU stream (on Apple
silicon the memory is shared, so this costs no copy).
"""

from __future__ import annotations

import math

import mlx.core as mx

__all__ = ["sampling_probs", "sample_inverse_cdf"]


# fdlibm's split of ln 2 (the high part has trailing zero bits, so k * LN2_HI is exact)
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00


def _exp_f64(x: mx.array) -> mx.array:
    """``exp`` of a float64 array to within 1 ulp (for ``x <= 0``; 0 below the normal range).

    MLX's own float64 ``exp`` has float32 accuracy (relative error ~1e-7), which would move the
    sampling decisions' float64 thresholds; add, multiply and floor are exact IEEE float64, so:
    ``x = k ln2 + r`` (Cody-Waite), ``exp(r)`` by its Taylor series to degree 17 (|r| <= ln2/2),
    times ``2^k`` built from the exponent bits. Results below 2^-1022 (x < -708.4) flush to 0
    where IEEE exp would give a subnormal.
    """
    k = mx.maximum(mx.floor(x * _INV_LN2 + 0.5), -1100.0)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    s = mx.zeros_like(r) + 1.0 / math.factorial(17)
    for n in range(16, -1, -1):
        s = s * r + 1.0 / math.factorial(n)
    ki = k.astype(mx.int64)
    scale = mx.view(mx.left_shift(mx.maximum(ki + 1023, 0), 52), mx.float64)
    return mx.where(ki < -1022, 0.0, s * scale)


def sampling_probs(logits: mx.array, temperature: float, top_k: int = 0, top_p: float = 1.0) -> mx.array:
    """The sampling distribution after temperature, top-k and top-p, in float64 (CPU stream).

    The arithmetic of ``redrafter_ext.sampling.sampling_probs``: ``x = f64(logits) * (1/T)``;
    top-k keeps ``x >=`` the k-th largest (boundary ties kept); ``p = exp(x - max) / Z`` with ``Z``
    the sequential index-order sum; top-p keeps the smallest descending prefix (ties: lower index
    first) whose exclusive mass is ``< top_p``, renormalised by the sequential sum of the kept ``p``.

    Args:
        logits: ``(..., V)`` float32/float16/bfloat16.
        temperature: ``> 0``. top_k: 0 (off) or tokens kept. top_p: in ``(0, 1]``, 1 is off.

    Returns:
        ``(..., V)`` float64 probabilities.
    """
    with mx.stream(mx.cpu):
        x = logits.astype(mx.float64) * (1.0 / float(temperature))
        V = x.shape[-1]
        if 0 < top_k < V:
            thr = mx.min(mx.topk(x, top_k, axis=-1), axis=-1, keepdims=True)
            x = mx.where(x >= thr, x, -math.inf)
        e = _exp_f64(x - mx.max(x, axis=-1, keepdims=True))
        # cumsum is a sequential sum, as the torch reference's: the same float64 normaliser
        p = e / mx.cumsum(e, axis=-1)[..., -1:]
        if top_p < 1.0:
            order = mx.argsort(-p, axis=-1)  # stable: equal probabilities keep index order
            csum = mx.cumsum(mx.take_along_axis(p, order, axis=-1), axis=-1)
            excl = mx.concatenate([mx.zeros_like(csum[..., :1]), csum[..., :-1]], axis=-1)
            keep = mx.put_along_axis(mx.zeros(p.shape, dtype=mx.bool_), order, excl < top_p, axis=-1)
            p = mx.where(keep, p, 0.0)
            p = p / mx.cumsum(p, axis=-1)[..., -1:]
        return p


def sample_inverse_cdf(probs: mx.array, u: mx.array) -> mx.array:
    """Inverse-CDF sampling: the first token whose cumulative mass exceeds ``u * total``.

    Args:
        probs: ``(..., V)`` non-negative weights (need not sum to 1).
        u: ``(...)`` uniforms in ``[0, 1)`` (float32).

    Returns:
        ``(...)`` int32 token ids; never a zero-weight token.
    """
    with mx.stream(mx.cpu):
        c = mx.cumsum(probs, axis=-1)
        thr = u.astype(probs.dtype)[..., None] * c[..., -1:]
        tok = mx.sum((c <= thr).astype(mx.int32), axis=-1)
        idx = mx.arange(probs.shape[-1], dtype=mx.int32)
        last_pos = mx.max(mx.where(probs > 0, idx, 0), axis=-1)
        return mx.minimum(tok, last_pos).astype(mx.int32)
