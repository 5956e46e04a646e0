"""Host-side parts of ``generate`` shared by the torch and MLX decode loops (imports neither).

Argument checks run once before decoding starts, on plain Python values; ``GenerateOutput`` is the
result of both backends' ``generate``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


def check_sampling(temperature: float, top_k: int, top_p: float) -> None:
    """The ranges of ``SamplingParams``: temperature finite >= 0, top_k int >= 0, top_p in (0, 1]."""
    t = temperature
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t >= 0):
        raise ValueError(f"sampling: temperature must be a finite float >= 0, got {t!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"sampling: top_k must be an int >= 0 (0: off), got {top_k!r}")
    p = top_p
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
        raise ValueError(f"sampling: top_p must be a float in (0, 1] (1: off), got {p!r}")


def prompt_rows(prompts: Iterable[Iterable[int]], vocab_size: int) -> list[list[int]]:
    """The prompts as lists of ints, each non-empty with ids in ``[0, vocab_size)``."""
    rows = [list(map(int, p)) for p in prompts]
    if not rows:
        raise ValueError("generate: prompts is empty")
    V = vocab_size
    for b, p in enumerate(rows):
        if not p:
            raise ValueError(f"generate: prompts[{b}] is empty")
        bad = [t for t in p if not 0 <= t < V]
        if bad:
            raise ValueError(f"generate: prompts[{b}] has token id {bad[0]} outside the vocabulary [0, {V})")
    return rows


def check_generate_args(max_new_tokens: int, eos_id: int | None, vocab_size: int) -> None:
    if max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be >= 0, got {max_new_tokens}")
    if eos_id is not None and not 0 <= eos_id < vocab_size:
        raise ValueError(f"generate: eos_id={eos_id} is outside the vocabulary [0, {vocab_size})")


def cache_length(T: int, max_new_tokens: int, slack: int, max_len: int | None) -> int:
    """Cache slots S: ``max_len``, or by default just enough, which is prompt ``T`` + ``max_new_tokens``
    + ``slack`` (the tree of the last step starts at most at prompt + max_new - 1 and needs ``slack``)."""
    need = T + max_new_tokens + slack
    S = max_len or need
    if S < need:
        raise ValueError(
            f"generate: max_len={S} leaves no room: prompt {T} + max_new_tokens {max_new_tokens} "
            f"+ trie N={slack} needs {need} cache slots"
        )
    return S


@dataclass
class GenerateOutput:
    """tokens: generated ids per row (EOS included when hit); steps/nodes: per-row decode steps and
    trie nodes verified; state: the final decode state (cache included) of the backend that ran."""

    tokens: list[list[int]]
    steps: list[int]
    nodes: list[int]
    state: Any

    @property
    def tokens_per_step(self) -> float:
        """Mean committed tokens per decode step over all rows (accepted + 1)."""
        return sum(map(len, self.tokens)) / max(1, sum(self.steps))
