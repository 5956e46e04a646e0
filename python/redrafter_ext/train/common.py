"""Pieces shared by the target and drafter training scripts."""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm


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


def adamw(params, lr: float, weight_decay: float, betas: tuple[float, float]) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (biases, norms and other vectors are not decayed)."""
    params = list(params)
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=betas,
    )


def optimizer_step(loss: torch.Tensor, params, opt: torch.optim.Optimizer, grad_clip: float) -> torch.Tensor:
    """Backward, gradient clipping to ``grad_clip``, one optimiser step; returns the pre-clip norm."""
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return gnorm


class StepLoop:
    """The optimisation loop of the training scripts: iterate it for the learning rate of each step
    (``lr_at``, already set on ``opt``), call ``done`` after the step. It stops at ``budget`` seconds
    from ``start`` or at ``cfg.max_steps``, whichever comes first; the bar counts seconds under a
    budget, else steps."""

    def __init__(self, cfg, opt: torch.optim.Optimizer, budget: float | None, desc: str | None = None,
                 start: float | None = None) -> None:
        self.cfg, self.opt, self.budget = cfg, opt, budget
        self.start = time.time() if start is None else start
        self.step = 0
        self.bar = tqdm(total=cfg.max_steps if budget is None else int(budget), unit="step" if budget is None else "s",
                        dynamic_ncols=True, desc=desc)
        self._bar_pos = 0

    @property
    def minutes(self) -> float:
        return (time.time() - self.start) / 60

    def __iter__(self) -> Iterator[float]:
        try:
            while True:
                progress = 0.0 if self.budget is None else (time.time() - self.start) / self.budget
                if self.cfg.max_steps is not None:
                    progress = max(progress, self.step / self.cfg.max_steps)
                if progress >= 1.0:
                    return
                lr = lr_at(self.cfg, self.step, progress)
                for g in self.opt.param_groups:
                    g["lr"] = lr
                yield lr
        finally:
            self.bar.close()

    def done(self, **postfix) -> None:
        """Counts the step and shows ``postfix`` (after ``step``) on the bar."""
        self.step += 1
        pos = self.step if self.budget is None else int(min(time.time() - self.start, self.budget))
        self.bar.update(pos - self._bar_pos)
        self._bar_pos = pos
        self.bar.set_postfix(step=self.step, **postfix)


def start_job(threads: int | None) -> None:
    """Every training job's set-up: denormals flushed (some AdamW steps took seconds without it) and
    ``threads`` torch threads when given."""
    torch.set_flush_denormal(True)
    if threads:
        torch.set_num_threads(threads)


def tied_embedding(model, op: str) -> tuple[Tensor, int | None]:
    """``(embed (V, H) float32, eos id or None)`` of a target whose LM head is its input embedding
    (the drafter's teacher distribution is ``hidden @ embed.T``)."""
    embed = model.get_input_embeddings().weight.detach().float()
    if not torch.equal(embed, model.get_output_embeddings().weight.detach().float()):
        raise ValueError(f"{op} expects a target with tie_word_embeddings=True")
    eos = model.config.eos_token_id
    return embed, eos[0] if isinstance(eos, list) else eos


def load_target(name_or_folder: str | Path):
    """``(transformers LlamaForCausalLM float32, eval, frozen; its tokenizer or None; folder)`` of a
    named model (``hub.model_folder``: "tiny", "smollm2-135m-instruct") or a Hugging Face folder."""
    from transformers import LlamaForCausalLM

    from ..hub import load_tokenizer, model_folder

    folder = model_folder(name_or_folder)
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, load_tokenizer(folder), folder


def distill_loss(drafter, h: Tensor, emb: Tensor, th: Tensor, head: Tensor, hard_weight: float,
                 teacher_temperature: float = 1.0):
    """Soft cross-entropy to the target's distribution sharpened by ``teacher_temperature``
    (< 1 concentrates the drafter on the target's argmax, which is what greedy verification
    accepts), plus ``hard_weight`` x CE on the argmax. Returns (loss, KL per step, agreement per step)."""
    logits = drafter.unroll(h, emb).float()  # [B, K, V]
    # the teacher in float32 even under autocast: sharpening magnifies bf16 rounding of its logits
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        th, head = th.float(), head.float()
        t_logp = torch.log_softmax((th @ head.T) / teacher_temperature, dim=-1)  # [B, K, V]
        t_p = t_logp.exp()
        t_arg = t_logp.argmax(-1)
    logq = torch.log_softmax(logits, dim=-1)
    ce = -(t_p * logq).sum(-1)  # [B, K]
    ent = -(t_p * t_logp).sum(-1)
    loss = ce.mean()
    if hard_weight:
        loss = loss + hard_weight * F.nll_loss(logq.reshape(-1, logq.shape[-1]), t_arg.reshape(-1))
    agree = (logits.argmax(-1) == t_arg).float().mean(0)  # [K]
    return loss, (ce - ent).mean(0).detach(), agree


def accepted_tokens(drafts: Tensor, truth: Tensor) -> Tensor:
    """Tokens one greedy verify commits: 1 (the guaranteed token) + the longest prefix of any beam that
    matches the answer. ``drafts (B, W, M)`` the tokens drafted after the guaranteed one, ``truth (B, M)``
    the answer's next M tokens (a value no draft holds, e.g. -2, where it has ended) -> ``(B,)`` float."""
    return 1 + (drafts.long() == truth.long()[:, None, :]).int().cumprod(-1).sum(-1).max(-1).values.float()


def save_drafter(drafter, out: str | Path, summary: dict) -> None:
    """The drafter in bf16 and its ``training_summary.json`` into ``out``, atomically (a temporary
    folder beside it, then renames): a reader never sees half a checkpoint."""
    from ..drafter import Drafter

    out = Path(out)
    ship = Drafter(drafter.config)
    ship.load_state_dict(drafter.state_dict())
    ship = ship.to(torch.bfloat16)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = out.parent / f".{out.name}.tmp", out.parent / f".{out.name}.old"
    shutil.rmtree(tmp, ignore_errors=True)
    ship.save_pretrained(tmp)
    (tmp / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
