"""Distil a drafter from a chat target (e.g. SmolLM2-135M-Instruct) on its own responses.

    python -m redrafter_ext.train drafter --target smollm2-135m-instruct --minutes 40

Data (``chat_data``): the target's greedy and sampled (T = 0.7) answers to the training prompts,
with its final-norm hidden states; held-out prompts' greedy answers for evaluation. Generated
once into ``--data`` (resumable) unless already there.

Head: with ``--draft-vocab V_d`` the drafter scores only the V_d tokens the target emits most in
the data (measured here: a head over 8192 tokens trains ~6x faster than one over all 49152 and
reaches a lower loss in the same time); drafted indices map back to real ids (``Drafter.vocab_map``).

Loss: as ``distill``: soft cross-entropy to the target's next-token distribution, restricted to the
head's tokens and sharpened by ``--teacher-temperature``, for K look-ahead steps from every
response position, in float32 (``--bf16`` autocasts: on a CPU without AMX/avx512_bf16 a bf16 matmul
ran 4x slower than float32 here).
Checkpoints (bf16) are written atomically every ``--save-every-minutes`` and at the end.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from .. import reference
from ..drafter import Drafter, DrafterConfig
from .chat_data import ChatDataConfig, generate_chat_data, load_chat_data
from .common import (
    StepLoop,
    accepted_tokens,
    distill_loss,
    load_target,
    optimizer_step,
    save_drafter,
    start_job,
    tied_embedding,
)

if TYPE_CHECKING:  # distill dispatches chat targets here: a run-time import would be a cycle
    from .distill import DistillConfig

__all__ = ["train_chat", "flatten", "vocab_by_frequency"]


def flatten(recs: list[dict], K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenate responses: ``tokens (T,)`` long, ``hidden (T, H)`` f16, ``starts (S,)`` long.

    ``hidden[i]`` predicts ``tokens[i]``; a start i is valid when i..i+K lie in one response:
    the drafter then sees ``hidden[i]`` and tokens i..i+K-1 and is fitted to ``hidden[i+1..i+K]``.
    """
    toks, hids, starts = [], [], []
    off = 0
    for r in recs:
        P = r["prompt_len"]
        resp = r["tokens"][P:].long()
        R = min(len(resp), r["hidden"].shape[0])
        if R <= K:
            continue
        toks.append(resp[:R])
        hids.append(r["hidden"][:R])
        starts.append(torch.arange(off, off + R - K))
        off += R
    return torch.cat(toks), torch.cat(hids), torch.cat(starts)


def vocab_by_frequency(tokens: torch.Tensor, vocab: int, n: int, always: list[int]) -> torch.Tensor:
    """The ``n`` most frequent ids of ``tokens`` (``always`` first; ties and unseen ids by id)."""
    counts = torch.bincount(tokens, minlength=vocab).double()
    counts[torch.tensor(always, dtype=torch.long)] = float("inf")
    # stable sort: equal counts keep id order
    order = torch.sort(-counts, stable=True).indices
    return order[:n].clone()


def _gather(tokens, hidden, starts, K, embed):
    idx = starts[:, None] + torch.arange(K)[None, :]  # [B, K] tokens t+1..t+K
    h = hidden[starts].float()
    emb = torch.nn.functional.embedding(tokens[idx], embed)
    th = hidden[idx + 1].float()
    return h, emb, th


@torch.no_grad()
def evaluate_chat(drafter: Drafter, ev: tuple, cfg: DistillConfig, embed: torch.Tensor, beams: bool = True,
                  batch: int = 256, positions: int = 2048) -> dict:
    """Teacher-forced top-1 agreement per step (vs the target's argmax over the full vocabulary),
    and the expected tokens per step of a W x L beam search on held-out greedy answers."""
    tokens, hidden, starts = ev
    was = drafter.training
    drafter.eval()
    K = cfg.K
    g = torch.Generator().manual_seed(1234)
    sel = starts[torch.randperm(len(starts), generator=g)[:positions]]
    agree = torch.zeros(K)
    vmap = drafter.vocab_map
    for i in range(0, len(sel), batch):
        s = sel[i : i + batch]
        h, emb, th = _gather(tokens, hidden, s, K, embed)
        logits = drafter.unroll(h, emb).float()
        pred = logits.argmax(-1) if vmap is None else vmap[logits.argmax(-1)]
        agree += (pred == (th @ embed.T).argmax(-1)).float().sum(0)
    res = {"positions": len(sel), "agreement_per_step": (agree / len(sel)).tolist()}
    if beams:
        W, L = cfg.beam_width, cfg.beam_length
        ok = sel[(sel + L - 1) < len(tokens)]
        acc = []
        for i in range(0, len(ok), batch):
            s = ok[i : i + batch]
            b = drafter.beam_search(hidden[s].float(), tokens[s], embed, W, L, reference)  # [B, W, L]
            truth = tokens[s[:, None] + torch.arange(L)[None, :]]  # greedy answer: tokens t+1..t+L
            # a draft only counts inside one response: positions past its end never match there
            acc.append(accepted_tokens(b[:, :, 1:], truth[:, 1:]))
        res[f"beam_tokens_per_step_W{W}_L{L}"] = torch.cat(acc).mean().item()
    drafter.train(was)
    return res


def train_chat(cfg: DistillConfig) -> dict:
    start_job(cfg.threads)
    torch.manual_seed(cfg.seed)
    data = Path(cfg.data)
    heldout = data / "heldout"
    # reproducible data: generated here unless the folders already hold it (resumable)
    if cfg.beam_length - 1 > cfg.K:
        raise ValueError("beam_length - 1 must be <= K")
    if not list(data.glob("part-*.pt")) or cfg.regenerate_data:
        generate_chat_data(ChatDataConfig(target=cfg.target, out=str(data), passes=cfg.chat_passes,
                                          minutes=cfg.data_minutes, seed=cfg.seed, threads=cfg.threads))
    if not list(heldout.glob("part-*.pt")):
        generate_chat_data(ChatDataConfig(target=cfg.target, out=str(heldout), passes="0", split="heldout",
                                          seed=cfg.seed, threads=cfg.threads))
    extra = [Path(x) for x in cfg.extra_data.split(",") if x] if cfg.extra_data else []
    for f in extra:
        if not list(f.glob("part-*.pt")):
            raise FileNotFoundError(f"--extra-data {f}: no part-*.pt files; make them with `chat-data --out {f}`")
    t0 = time.time()  # --minutes budgets the training: data generation is bounded by --data-minutes
    model, _, folder = load_target(cfg.target)
    embed, eos = tied_embedding(model, "distill")
    H, V = model.config.hidden_size, model.config.vocab_size
    del model
    K = cfg.K
    tr = flatten(load_chat_data(data) + [r for f in extra for r in load_chat_data(f)], K)
    ev = flatten(load_chat_data(heldout), K)
    print(f"[drafter] target {folder}: hidden {H}, vocab {V}; train {len(tr[0]):,} response tokens "
          f"({len(tr[2]):,} positions), held-out {len(ev[0]):,}", flush=True)

    Vd = cfg.draft_vocab
    dcfg = DrafterConfig(hidden_size=H, vocab_size=V, num_layers=cfg.num_layers,
                         draft_vocab_size=Vd if Vd and Vd < V else None)
    drafter = Drafter(dcfg)
    head = embed
    if drafter.vocab_map is not None:
        ids = vocab_by_frequency(tr[0], V, dcfg.draft_vocab_size, [eos] if eos is not None else [])
        drafter.set_vocab_map(ids)
        head = embed[ids]
        cover = torch.isin(ev[0], ids).float().mean().item()
        print(f"[drafter] head over the {len(ids)} most frequent tokens: they cover {100 * cover:.2f}% of "
              "held-out response tokens", flush=True)
    n_params = sum(p.numel() for p in drafter.parameters())
    opt = torch.optim.AdamW(drafter.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    summary = {"target": str(cfg.target), "target_folder": str(folder), "parameters": n_params, "hidden_size": H,
               "vocab_size": V, "draft_vocab_size": dcfg.draft_vocab_size, "num_layers": cfg.num_layers, "K": K,
               "train_tokens": len(tr[0]), "train_positions": len(tr[2]), "heldout_tokens": len(ev[0]),
               "config": asdict(cfg), "history": []}
    out = Path(cfg.out)
    budget = cfg.minutes * 60 - (time.time() - t0) - cfg.reserve_minutes * 60 if cfg.minutes else None
    gen = torch.Generator().manual_seed(cfg.seed)
    perm, cursor, seen = torch.randperm(len(tr[2]), generator=gen), 0, 0
    ema = None
    loop = StepLoop(cfg, opt, budget, "distill")
    t_loop = last_save = loop.start
    drafter.train()
    for lr in loop:
        if cursor + cfg.batch_size > len(perm):
            perm, cursor = torch.randperm(len(tr[2]), generator=gen), 0
        s = tr[2][perm[cursor : cursor + cfg.batch_size]]
        cursor += cfg.batch_size
        h, emb, th = _gather(tr[0], tr[1], s, K, embed)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            loss, kl, agree = distill_loss(drafter, h, emb, th, head, cfg.hard_weight, cfg.teacher_temperature)
        optimizer_step(loss, drafter.parameters(), opt, cfg.grad_clip)
        seen += len(s)
        ema = agree if ema is None else 0.95 * ema + 0.05 * agree
        loop.done(loss=f"{loss.item():.3f}", a1=f"{ema[0]:.3f}", aK=f"{ema[-1]:.3f}", lr=f"{lr:.1e}")
        step = loop.step
        if step % cfg.eval_every == 0:
            r = evaluate_chat(drafter, ev, cfg, embed, beams=False)
            r.update(step=step, minutes=(time.time() - t_loop) / 60, load=os.getloadavg()[0])
            summary["history"].append(r)
            tqdm.write(f"[drafter] step {step} ({r['minutes']:.1f} min, load {r['load']:.1f}): held-out agreement "
                       + " ".join(f"{x:.3f}" for x in r["agreement_per_step"]))
        if time.time() - last_save > cfg.save_every_minutes * 60:
            summary.update(steps=step, positions_seen=seen)
            save_drafter(drafter, out, summary)
            last_save = time.time()
    step = loop.step
    drafter.eval()
    final = evaluate_chat(drafter, ev, cfg, embed, beams=True)
    summary.update(steps=step, positions_seen=seen, train_minutes=(time.time() - t_loop) / 60,
                   total_minutes=(time.time() - t0) / 60, eval=final)
    save_drafter(drafter, out, summary)
    print(f"[drafter] saved to {out}: {n_params:,} parameters (bf16), {step} steps, {seen:,} positions")
    print("[drafter] held-out agreement per step: " + " ".join(f"{x:.3f}" for x in final["agreement_per_step"]))
    for k, v in final.items():
        if "tokens_per_step" in k:
            print(f"[drafter] {k}: {v:.3f}")
    return summary
