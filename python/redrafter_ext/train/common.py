"""Pieces shared by the target and drafter training scripts."""

from __future__ import annotations

import argparse
import math


def lr_at(cfg, step: int, progress: float) -> float:
    """Linear warmup over ``cfg.warmup_steps`` steps, then cosine from ``cfg.lr`` down to
    ``cfg.lr * cfg.min_lr_ratio`` as ``progress`` (of the step or time budget) goes 0 -> 1."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    p = min(max(progress, 0.0), 1.0)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * p)))


def dataclass_from_args(cls, a: argparse.Namespace):
    """An instance of the config dataclass ``cls`` from the parsed options named like its fields."""
    names = set(cls.__dataclass_fields__)
    return cls(**{k: v for k, v in vars(a).items() if k in names})
