"""Distillation data from a chat target: its own responses to instruction prompts.

    python -m redrafter_ext.train chat-data --target smollm2-135m-instruct --out DATA_DIR --minutes 35

Each prompt is wrapped in the target's chat template and answered greedily and, in further passes,
by sampling at ``--temperature`` (0.7 by default), so that the drafter learns what the target says
in both modes. Responses stop at the target's EOS (``<|im_end|>``: left alone the model often runs
on into an invented next turn). While generating, a forward hook on the final norm captures the
target's hidden states, so no second pass is needed.

Output: one ``part-XXXXX.pt`` file per batch, written atomically (a crash or a stop loses at most
the batch in flight; a rerun skips finished parts): a list of records
``{"prompt": i, "temperature": T, "tokens": (P + R,) int32, "prompt_len": P,
"hidden": (R, H) float16}`` where ``hidden[j]`` is the target's final-norm hidden state at position
``P - 1 + j`` (it predicts response token j), R the response length including EOS.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..prompts import chat_prompt_ids, heldout_prompts
from . import prompts as prompt_sets

__all__ = ["ChatDataConfig", "generate_chat_data", "load_chat_data"]


@dataclass
class ChatDataConfig:
    target: str = "smollm2-135m-instruct"
    out: str = ""
    num_prompts: int | None = None  # train prompts used (all by default)
    passes: str = "0,0.7,0.7"  # temperature of each pass over the prompts (0: greedy)
    max_new_tokens: int = 160
    batch: int = 32
    minutes: float | None = None  # stop starting new batches after this long
    max_batches: int | None = None  # generate only the first this many batches (parts): a reproducible size
    seed: int = 0
    threads: int | None = None
    split: str = "train"  # "train": the template pool; "broad": the broad pool; "heldout": the held-out prompts


@torch.no_grad()
def _generate_batch(model, rows: list[list[int]], temperature: float, max_new: int, eos: int, seed: int):
    """Left-padded batch generation; returns per row (response ids incl. EOS, hidden (R, H) f16)."""
    B = len(rows)
    P = max(map(len, rows))
    ids = torch.full((B, P), eos, dtype=torch.long)
    mask = torch.zeros(B, P, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, P - len(r):] = torch.tensor(r)
        mask[b, P - len(r):] = 1
    captured: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_hook(lambda m, i, o: captured.append(o.detach().to(torch.float16)))
    try:
        torch.manual_seed(seed)
        kw = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(do_sample=False)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new, eos_token_id=eos,
                             pad_token_id=eos, **kw)
    finally:
        hook.remove()
    hidden = torch.cat(captured, dim=1)  # [B, P + steps, H]: position t predicts token t+1
    gen = out[:, P:]
    res = []
    for b in range(B):
        g = gen[b].tolist()
        R = g.index(eos) + 1 if eos in g else len(g)
        h = hidden[b, P - 1 : P - 1 + R]
        if h.shape[0] < R:  # the last token of a row that hit max_new_tokens was never fed back
            R = h.shape[0]
        res.append((g[:R], h[:R].clone()))
    return res


def generate_chat_data(cfg: ChatDataConfig) -> Path:
    """Generate (or resume) the data set in ``cfg.out``; returns that folder."""
    from .common import load_target, start_job

    start_job(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok, folder = load_target(cfg.target)
    if tok is None or not getattr(tok, "chat_template", None):
        raise ValueError(f"chat-data: the target {folder} has no tokenizer with a chat template")
    eos = int(model.config.eos_token_id if not isinstance(model.config.eos_token_id, list)
              else model.config.eos_token_id[0])
    pools = {"train": prompt_sets.train_prompts, "broad": prompt_sets.broad_prompts,
             "heldout": heldout_prompts}
    if cfg.split not in pools:
        raise ValueError(f"chat-data: split must be one of {', '.join(pools)}, got {cfg.split!r}")
    texts = pools[cfg.split](cfg.num_prompts)
    rows = [chat_prompt_ids(tok, t) for t in texts]
    temps = [float(x) for x in cfg.passes.split(",")]
    (out / "config.json").write_text(json.dumps({**asdict(cfg), "target_folder": str(folder), "eos": eos,
                                                 "num_train_prompts": len(texts)}, indent=2) + "\n")
    # batches of one temperature, prompts of similar length together (less padding); all passes'
    # batches shuffled together, so a run stopped by --minutes holds each pass in proportion
    jobs = []
    for p, T in enumerate(temps):
        order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
        batches = [order[i : i + cfg.batch] for i in range(0, len(order), cfg.batch)]
        jobs += [(p, T, b) for b in batches]
    random.Random(cfg.seed).shuffle(jobs)
    t0 = time.time()
    n_tok = 0
    if cfg.max_batches is not None and cfg.max_batches < 1:
        raise ValueError(f"chat-data: max_batches must be >= 1, got {cfg.max_batches}")
    total = len(jobs) if cfg.max_batches is None else min(len(jobs), cfg.max_batches)
    bar = tqdm(total=total, desc="chat data", unit="batch", dynamic_ncols=True)
    for j, (_pass, T, idx) in enumerate(jobs):
        part = out / f"part-{j:05d}.pt"
        if part.exists():
            bar.update(1)
            continue
        if cfg.max_batches is not None and j >= cfg.max_batches:
            break
        if cfg.minutes is not None and time.time() - t0 > cfg.minutes * 60:
            tqdm.write(f"[chat-data] time budget used up after {j} of {len(jobs)} batches")
            break
        res = _generate_batch(model, [rows[i] for i in idx], T, cfg.max_new_tokens, eos, cfg.seed * 100003 + j)
        recs = []
        for i, (resp, h) in zip(idx, res):
            recs.append({"prompt": i, "temperature": T, "prompt_len": len(rows[i]),
                         "tokens": torch.tensor(rows[i] + resp, dtype=torch.int32), "hidden": h})
            n_tok += len(resp)
        tmp = part.with_suffix(".tmp")
        torch.save(recs, tmp)
        os.replace(tmp, part)
        bar.update(1)
        el = time.time() - t0
        bar.set_postfix(tokens=n_tok, tok_s=f"{n_tok / el:.0f}", T=T)
        tqdm.write(f"[chat-data] part {j}: T={T} {sum(len(r[0]) for r in res)} tokens, "
                   f"total {n_tok} in {el / 60:.1f} min ({n_tok / el:.0f} tok/s), "
                   f"load {os.getloadavg()[0]:.1f}")
    bar.close()
    return out


def load_chat_data(folder: str | Path) -> list[dict]:
    """All records of a data folder (see the module docstring), in part order."""
    parts = sorted(Path(folder).glob("part-*.pt"))
    if not parts:
        raise FileNotFoundError(f"no part-*.pt files in {folder}: generate them with `chat-data`")
    recs = []
    for p in parts:
        recs += torch.load(p, weights_only=True)
    return recs


def add_args(p: argparse.ArgumentParser) -> None:
    d = ChatDataConfig()
    p.add_argument("--target", default=d.target, help="model name or Hugging Face folder")
    p.add_argument("--out", required=True, help="data folder (resumable)")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--passes", default=d.passes, help="comma-separated temperature per pass (0: greedy)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--minutes", type=float, default=None, help="stop starting new batches after this long")
    p.add_argument("--max-batches", type=int, default=None,
                   help="only the first N batches (part files; each --batch prompts): the data set's size, "
                   "independent of the machine's speed")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--split", choices=("train", "broad", "heldout"), default=d.split,
                   help="prompt pool: train (templates x subjects), broad (everyday requests), heldout")


def config_from_args(a: argparse.Namespace) -> ChatDataConfig:
    from .common import dataclass_from_args

    return dataclass_from_args(ChatDataConfig, a)
