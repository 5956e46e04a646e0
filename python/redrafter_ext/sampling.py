"""The sampling distribution (temperature, top-k, top-p) and inverse-CDF sampling, in torch.

Production code (``decode.SamplingParams``) and the oracle (``reference.verify_sample``) both use
these, so the native ``verify_sample`` kernels match them bit for bit; neither module owns them.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["sampling_probs", "sample_inverse_cdf"]


def sampling_probs(logits: Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """The sampling distribution of ``logits`` after temperature, top-k and top-p, in float64.

    The exact arithmetic (shared bit for bit with the native ``verify_sample`` kernel, whose
    decisions must equal this reference's given the same uniforms):

    1. ``x = float64(logits) * (1.0 / temperature)`` (``temperature > 0``; the reciprocal is a
       Python float, so one correctly rounded float64 multiply per logit).
    2. top-k (``0 < top_k < V``): keep the tokens with ``x >= `` the k-th largest ``x`` (ties at
       the boundary are all kept, as in Hugging Face's ``TopKLogitsWarper``).
    3. ``e = exp(x - max(x))`` on kept tokens (0 elsewhere); ``p = e / Z`` with ``Z`` the sum of
       ``e`` in index order (``cumsum(-1)[..., -1]``: a sequential float64 sum).
    4. top-p (``top_p < 1``): sort ``p`` descending (ties: lower index first), keep the tokens whose
       exclusive prefix mass (sequential float64 sum in that order) is ``< top_p``, i.e. the
       smallest prefix holding at least ``top_p`` (at least one token), then renormalise by the
       sequential index-order sum of the kept ``p``.

    Args:
        logits: ``(..., V)`` float32/float16/bfloat16.
        temperature: ``> 0``.
        top_k: 0 (off) or the number of tokens kept.
        top_p: in ``(0, 1]``; 1 is off.

    Returns:
        ``(..., V)`` float64 probabilities, summing to 1 up to rounding.
    """
    x = logits.double() * (1.0 / float(temperature))
    V = x.shape[-1]
    if 0 < top_k < V:
        thr = torch.topk(x, top_k, dim=-1).values[..., -1:]
        x = torch.where(x >= thr, x, float("-inf"))
    e = torch.exp(x - x.amax(dim=-1, keepdim=True))
    p = e / e.cumsum(dim=-1)[..., -1:]
    if top_p < 1.0:
        sp, order = torch.sort(p, dim=-1, descending=True, stable=True)
        csum = sp.cumsum(dim=-1)
        excl = torch.cat([torch.zeros_like(csum[..., :1]), csum[..., :-1]], dim=-1)
        keep_sorted = excl < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        p = torch.where(keep, p, 0.0)
        p = p / p.cumsum(dim=-1)[..., -1:]
    return p


def sample_inverse_cdf(probs: Tensor, u: Tensor) -> Tensor:
    """Inverse-CDF sampling: the first token whose cumulative mass exceeds ``u * total``.

    Args:
        probs: ``(..., V)`` non-negative weights (float64 from ``sampling_probs``), need not sum
            to 1 (a residual distribution is renormalised implicitly).
        u: ``(...)`` uniforms in ``[0, 1)`` (float32).

    Returns:
        ``(...)`` int32 token ids; never a zero-weight token (rounding that would step past the
        last positive weight is clamped to it).
    """
    c = probs.cumsum(dim=-1)
    thr = u.double()[..., None] * c[..., -1:]
    tok = (c <= thr).sum(dim=-1)
    V = probs.shape[-1]
    idx = torch.arange(V, device=probs.device)
    last_pos = torch.where(probs > 0, idx, 0).amax(dim=-1)
    return torch.minimum(tok, last_pos).to(torch.int32)
