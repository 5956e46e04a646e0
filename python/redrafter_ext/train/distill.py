"""Stage 2: distill the ReDrafter drafter from the trained target.

    python -m redrafter_ext.train drafter --minutes 25

Data: the target's own continuations of corpus prompts (train split for training, heldout for
evaluation), generated in batches with a KV cache: greedy, plus a fraction sampled at a
temperature for diversity. The target then runs once over every finished sequence (float32, no
grad) to give its final hidden states (after the final norm) ``h``; its next-token distributions
are recomputed on the fly from ``h`` with its tied LM head.

Loss: for a position t of a continuation and k = 1..K, the drafter's step-k logits (from ``h_t``
and the target's frozen embeddings of tokens t+1..t+k) are fitted to the target's distribution
at position t+k (which predicts token t+k+1) by soft cross-entropy, the target's distribution
sharpened by ``--teacher-temperature`` (0.25 by default). Sharpening matters for beam search:
fitted to the plain distribution (T = 1), beams of width 4 ranked by the drafter's joint
probability often drop the target's greedy path, and accept fewer tokens than a width-1 chain.

Evaluation (heldout prompts, greedy continuations): per-step top-1 agreement with the target's
argmax (teacher-forced), the mean accepted tokens per decode step of a greedy chain, and of a
beam search of width W and length L (drafted from ``h_t`` and the guaranteed token t+1, accepted
= 1 + the longest prefix of draft tokens any beam shares with the target's greedy continuation).
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from .. import corpus, reference
from ..drafter import Drafter, DrafterConfig
from .common import (
    StepLoop,
    accepted_tokens,
    adamw,
    dataclass_from_args,
    distill_loss,
    load_target,
    optimizer_step,
    start_job,
    tied_embedding,
)

__all__ = ["DistillConfig", "add_args", "config_from_args", "evaluate", "generate_data", "train"]

_CKPT = Path(__file__).resolve().parent.parent / "checkpoints"


@dataclass
class DistillConfig:
    target: str = str(_CKPT / "target")
    out: str = str(_CKPT / "drafter")
    seed: int = 0
    minutes: float | None = None  # total budget: data generation + training + evaluation
    max_steps: int | None = None
    # drafter
    num_layers: int = 2
    K: int = 5  # look-ahead steps trained (beam length L = K + 1 at most)
    # data
    prompt_tokens: int = 48
    gen_tokens: int = 128
    gen_batch: int = 128
    num_seqs: int = 2048  # train continuations (fewer when the data budget runs out)
    data_frac: float = 0.45  # at most this fraction of --minutes generating train data
    sample_frac: float = 0.25  # fraction of train continuations sampled instead of greedy
    temperature: float = 0.8
    eval_seqs: int = 64
    # optimisation
    batch_size: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 50
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    hard_weight: float = 0.0  # extra CE on the target's argmax
    teacher_temperature: float = 0.25  # < 1 sharpens the target's distribution (soft labels)
    threads: int | None = None
    # evaluation
    eval_every: int = 200
    beam_width: int = 4
    beam_length: int = 5
    beam_eval_positions: int = 2048
    reserve_minutes: float = 1.5  # kept from --minutes for the final evaluation and save
    # corpus subset (tests)
    limit_files: int | None = None
    corpus_root: str | None = None
    # chat targets (distill_chat): data folder, reduced head, sampling passes
    data: str | None = None  # default: <cache>/distill/<target name>
    extra_data: str | None = None  # more chat data folders (comma-separated), e.g. another prompt pool
    draft_vocab: int | None = 8192  # head over the most frequent tokens (chat targets only)
    chat_passes: str = "0,0.7,0.7"  # temperature of each pass over the training prompts
    data_minutes: float | None = None  # stop generating new chat data after this long
    regenerate_data: bool = False
    bf16: bool = False  # chat: bf16 autocast (pays only on CPUs with bf16 matmul units: AMX/avx512_bf16)
    save_every_minutes: float = 5.0


# --------------------------------------------------------------------------------------------
# data


def prompt_windows(tok, split: str, n: int, length: int, seed: int, limit_files: int | None, root: str | None) -> Tensor:
    """``n`` windows of ``length`` tokens from ``split`` files, starting at line beginnings."""
    rng = random.Random(seed)
    eos = tok.convert_tokens_to_ids(corpus.EOS_TOKEN)
    texts = list(corpus.iter_texts(split, root=root, limit_files=limit_files))
    streams = [[eos] + e.ids for e in tok.backend_tokenizer.encode_batch(texts)]
    streams = [s for s in streams if len(s) > length + 1]
    if not streams:
        raise RuntimeError(f"no {split} file longer than {length} tokens")
    # line starts: tokens right after a token containing a newline
    nl = {i for t, i in tok.get_vocab().items() if "Ċ" in t}
    weights = [len(s) for s in streams]
    out = []
    for _ in range(n):
        s = rng.choices(streams, weights)[0]
        start = rng.randrange(0, len(s) - length)
        for j in range(start, min(start + 200, len(s) - length)):
            if j == 0 or s[j - 1] in nl:
                start = j
                break
        out.append(s[start : start + length])
    return torch.tensor(out, dtype=torch.long)


@functools.cache
def _cache_kw() -> str:
    import inspect

    from transformers import LlamaForCausalLM

    params = inspect.signature(LlamaForCausalLM.forward).parameters
    return "cache" if "cache" in params else "past_key_values"  # transformers >= 5.2x renamed it


def _cache_of(out):
    return getattr(out, "cache", None) if getattr(out, "cache", None) is not None else out.past_key_values


@torch.no_grad()
def continue_batch(model, prompts: Tensor, new_tokens: int, temperature: float, gen: torch.Generator) -> Tensor:
    """Continue ``prompts (B, P)`` by ``new_tokens`` tokens with a KV cache (greedy if temperature 0)."""
    out = model(input_ids=prompts, use_cache=True)
    past = _cache_of(out)
    logits = out.logits[:, -1].float()
    toks = [prompts]
    for i in range(new_tokens):
        if temperature > 0:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
        else:
            nxt = logits.argmax(dim=-1, keepdim=True)
        toks.append(nxt)
        if i + 1 == new_tokens:
            break
        out = model(input_ids=nxt, use_cache=True, **{_cache_kw(): past})
        past = _cache_of(out)
        logits = out.logits[:, -1].float()
    return torch.cat(toks, dim=1)


@torch.no_grad()
def target_hidden(model, seqs: Tensor, batch: int = 32) -> Tensor:
    """Final-norm hidden states ``(N, T, H)`` of the target over ``seqs (N, T)``."""
    hs = []
    for i in range(0, len(seqs), batch):
        hs.append(model.model(input_ids=seqs[i : i + batch]).last_hidden_state.float())
    return torch.cat(hs)


def generate_data(
    model, tok, cfg: DistillConfig, split: str, n: int, sample_frac: float, seed: int, deadline: float | None, desc: str
) -> tuple[Tensor, Tensor]:
    """``(seqs (N, P+G) long, hidden (N, P+G, H) f32)``: continuations of ``split`` prompts."""
    prompts = prompt_windows(tok, split, n, cfg.prompt_tokens, seed, cfg.limit_files, cfg.corpus_root)
    gen = torch.Generator().manual_seed(seed)
    n_sampled = int(round(n * sample_frac))
    temps = [cfg.temperature] * n_sampled + [0.0] * (n - n_sampled)
    random.Random(seed).shuffle(temps)
    seqs, hidden = [], []
    bar = tqdm(total=n, desc=desc, unit="seq", dynamic_ncols=True)
    for i in range(0, n, cfg.gen_batch):
        if deadline is not None and i > 0 and time.time() > deadline:
            tqdm.write(f"[drafter] {desc}: data budget used up after {i} sequences")
            break
        chunk = prompts[i : i + cfg.gen_batch]
        t = temps[i : i + cfg.gen_batch]
        parts = []
        # greedy and sampled rows in separate calls
        g_idx = [j for j, x in enumerate(t) if x == 0.0]
        s_idx = [j for j, x in enumerate(t) if x > 0.0]
        res = torch.empty(len(chunk), cfg.prompt_tokens + cfg.gen_tokens, dtype=torch.long)
        if g_idx:
            res[g_idx] = continue_batch(model, chunk[g_idx], cfg.gen_tokens, 0.0, gen)
        if s_idx:
            res[s_idx] = continue_batch(model, chunk[s_idx], cfg.gen_tokens, cfg.temperature, gen)
        parts.append(res)
        seqs.append(res)
        hidden.append(target_hidden(model, res))
        bar.update(len(chunk))
    bar.close()
    return torch.cat(seqs), torch.cat(hidden)


# --------------------------------------------------------------------------------------------
# loss / evaluation


def positions(n_seqs: int, prompt: int, total: int, horizon: int) -> Tensor:
    """All (seq, t) with t in the continuation region: t >= prompt-1 and t + horizon <= total-1."""
    ts = torch.arange(prompt - 1, total - horizon)
    s = torch.arange(n_seqs)
    return torch.stack([s[:, None].expand(-1, len(ts)).reshape(-1), ts[None, :].expand(n_seqs, -1).reshape(-1)], dim=1)


def gather(seqs: Tensor, hidden: Tensor, pos: Tensor, K: int, embed: Tensor):
    """Batch tensors for positions ``pos (B, 2)``: h_t, embeddings of t+1..t+K, target hiddens at
    t+1..t+K, and the tokens t+1..t+K+1."""
    s, t = pos[:, 0], pos[:, 1]
    offs = torch.arange(1, K + 1)
    idx = t[:, None] + offs[None, :]  # [B, K]
    h = hidden[s, t]  # [B, H]
    toks = seqs[s[:, None], idx]  # [B, K]  tokens t+1..t+K
    nxt = seqs[s[:, None], torch.clamp(idx + 1, max=seqs.shape[1] - 1)]  # tokens t+2..t+K+1
    emb = F.embedding(toks, embed)  # [B, K, H]
    th = hidden[s[:, None], idx]  # [B, K, H]
    return h, emb, th, nxt


@torch.no_grad()
def evaluate(drafter: Drafter, seqs: Tensor, hidden: Tensor, cfg: DistillConfig, head: Tensor, beams: bool = True,
             batch: int = 256) -> dict:
    """Agreement and acceptance on greedy continuations ``seqs`` (with target ``hidden``)."""
    was_training = drafter.training
    drafter.eval()
    K = cfg.K
    pos = positions(len(seqs), cfg.prompt_tokens, seqs.shape[1], K)
    agree = torch.zeros(K)
    kl = torch.zeros(K)
    chain = torch.zeros(K + 1)  # histogram of leading matches 0..K
    n = 0
    for i in range(0, len(pos), batch):
        p = pos[i : i + batch]
        h, emb, th, nxt = gather(seqs, hidden, p, K, head)
        logits = drafter.unroll(h, emb).float()
        t_logp = torch.log_softmax(th @ head.T, dim=-1)
        t_arg = t_logp.argmax(-1)
        logq = torch.log_softmax(logits, dim=-1)
        kl += (t_logp.exp() * (t_logp - logq)).sum(-1).sum(0)
        m = logits.argmax(-1) == t_arg  # [B, K]
        agree += m.float().sum(0)
        lead = m.int().cumprod(-1).sum(-1)
        chain += torch.bincount(lead, minlength=K + 1).float()
        n += len(p)
    res = {
        "positions": n,
        "agreement_per_step": (agree / n).tolist(),
        "kl_per_step": (kl / n).tolist(),
    }
    # greedy chain of L-1 drafted tokens: accepted = 1 + leading matches (capped at L-1)
    lead_counts = chain / n
    for L in range(2, K + 2):
        exp = 1 + sum(min(j, L - 1) * lead_counts[j].item() for j in range(K + 1))
        res[f"chain_tokens_per_step_L{L}"] = exp
    if beams:
        W, L = cfg.beam_width, cfg.beam_length
        bpos = positions(len(seqs), cfg.prompt_tokens, seqs.shape[1], L)
        g = torch.Generator().manual_seed(1234)
        if len(bpos) > cfg.beam_eval_positions:
            bpos = bpos[torch.randperm(len(bpos), generator=g)[: cfg.beam_eval_positions]]
        acc = []
        for i in range(0, len(bpos), batch):
            p = bpos[i : i + batch]
            s, t = p[:, 0], p[:, 1]
            h = hidden[s, t]
            beams_ = drafter.beam_search(h, seqs[s, t + 1], head, W, L, reference)  # [B, W, L]
            truth = seqs[s[:, None], t[:, None] + torch.arange(1, L + 1)[None, :]]  # tokens t+1..t+L
            acc.append(accepted_tokens(beams_[:, :, 1:], truth[:, 1:]))
        acc = torch.cat(acc)
        res[f"beam_tokens_per_step_W{W}_L{L}"] = acc.mean().item()
        res["beam_positions"] = len(acc)
    drafter.train(was_training)
    return res


def _fmt(r: dict) -> str:
    a = " ".join(f"{x:.3f}" for x in r["agreement_per_step"])
    s = f"agree/step [{a}]"
    for k, v in r.items():
        if k.startswith("beam_tokens"):
            s += f" {k}={v:.3f}"
    return s


# --------------------------------------------------------------------------------------------
# training


def is_chat_target(target: str) -> bool:
    """A named chat model, or a folder whose tokenizer has a chat template."""
    from ..hub import MODELS

    if target in MODELS:
        return target != "tiny"
    folder = Path(target)
    if (folder / "chat_template.jinja").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def train(cfg: DistillConfig) -> dict:
    if cfg.target == "tiny":
        cfg.target = str(_CKPT / "target")
    if is_chat_target(cfg.target):
        from ..hub import cache_dir, drafter_folder
        from .distill_chat import train_chat

        name = Path(cfg.target).name
        if cfg.data is None:
            cfg.data = str(cache_dir() / "distill" / name)
        if cfg.out == DistillConfig.out:
            cfg.out = str(drafter_folder(cfg.target))
        return train_chat(cfg)
    if cfg.extra_data:
        raise ValueError("--extra-data is for chat targets (their own responses); this target trains on the corpus")
    start_job(cfg.threads)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    budget = cfg.minutes * 60.0 if cfg.minutes else None
    if budget is None and cfg.max_steps is None:
        raise ValueError("give --minutes and/or --max-steps")
    if cfg.beam_length - 1 > cfg.K:
        raise ValueError("beam_length - 1 must be <= K")
    out = Path(cfg.out)

    model, tok, _ = load_target(cfg.target)
    embed, _ = tied_embedding(model, "distill")
    H, V = model.config.hidden_size, model.config.vocab_size
    print(f"[drafter] target {cfg.target}: hidden {H}, vocab {V}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters", flush=True)

    # heldout greedy continuations for evaluation, then the train data
    ev_seqs, ev_hidden = generate_data(model, tok, cfg, "heldout", cfg.eval_seqs, 0.0, cfg.seed + 1, None, "eval data")
    data_deadline = t0 + budget * cfg.data_frac if budget else None
    tr_seqs, tr_hidden = generate_data(
        model, tok, cfg, "train", cfg.num_seqs, cfg.sample_frac, cfg.seed, data_deadline, "train data"
    )
    del model
    data_minutes = (time.time() - t0) / 60
    tr_pos = positions(len(tr_seqs), cfg.prompt_tokens, tr_seqs.shape[1], cfg.K)
    print(f"[drafter] data: {len(tr_seqs)} train continuations ({len(tr_pos):,} positions), "
          f"{len(ev_seqs)} eval continuations, {data_minutes:.1f} min", flush=True)

    drafter = Drafter(DrafterConfig(hidden_size=H, vocab_size=V, num_layers=cfg.num_layers))
    n_params = sum(p.numel() for p in drafter.parameters())
    print(f"[drafter] Drafter: {cfg.num_layers} layers, {n_params / 1e6:.2f}M parameters, K={cfg.K}", flush=True)
    opt = adamw(drafter.parameters(), cfg.lr, cfg.weight_decay, (0.9, 0.98))
    init = evaluate(drafter, ev_seqs, ev_hidden, cfg, embed, beams=False)
    print(f"[drafter] init: {_fmt(init)}", flush=True)

    gen = torch.Generator().manual_seed(cfg.seed)
    t_loop = time.time()
    train_budget = None
    if budget is not None:
        train_budget = max(budget - (t_loop - t0) - cfg.reserve_minutes * 60, 30.0)
    seen = 0
    perm = torch.randperm(len(tr_pos), generator=gen)
    cursor = 0
    history = []
    ema_loss = None
    ema_agree = None
    loop = StepLoop(cfg, opt, train_budget, "distill", start=t_loop)
    drafter.train()
    for lr in loop:
        if cursor + cfg.batch_size > len(perm):
            perm = torch.randperm(len(tr_pos), generator=gen)
            cursor = 0
        p = tr_pos[perm[cursor : cursor + cfg.batch_size]]
        cursor += cfg.batch_size
        h, emb, th, _ = gather(tr_seqs, tr_hidden, p, cfg.K, embed)
        loss, kl, agree = distill_loss(drafter, h, emb, th, embed, cfg.hard_weight, cfg.teacher_temperature)
        optimizer_step(loss, drafter.parameters(), opt, cfg.grad_clip)
        seen += len(p)
        ema_loss = kl.mean().item() if ema_loss is None else 0.95 * ema_loss + 0.05 * kl.mean().item()
        ema_agree = agree if ema_agree is None else 0.95 * ema_agree + 0.05 * agree
        loop.done(kl=f"{ema_loss:.3f}", a1=f"{ema_agree[0]:.3f}", aK=f"{ema_agree[-1]:.3f}", lr=f"{lr:.1e}")
        step = loop.step
        if step % cfg.eval_every == 0:
            r = evaluate(drafter, ev_seqs, ev_hidden, cfg, embed, beams=False)
            r.update(step=step, positions_seen=seen, train_kl_ema=ema_loss, minutes=(time.time() - t_loop) / 60)
            history.append(r)
            tqdm.write(f"[drafter] step {step}: train kl {ema_loss:.3f} | eval {_fmt(r)} "
                       f"chain L5 {r['chain_tokens_per_step_L5'] if 'chain_tokens_per_step_L5' in r else float('nan'):.3f}")
    step = loop.step
    train_minutes = loop.minutes

    # ship in bf16, evaluate the shipped weights (upcast, as decoding on CPU runs float32)
    drafter_bf16 = Drafter(drafter.config)
    drafter_bf16.load_state_dict(drafter.state_dict())
    drafter_bf16 = drafter_bf16.to(torch.bfloat16)
    drafter_bf16.save_pretrained(out)
    shipped = Drafter.from_pretrained(out, dtype=torch.float32)
    final = evaluate(shipped, ev_seqs, ev_hidden, cfg, embed, beams=True)
    summary = {
        "parameters": n_params,
        "target": str(cfg.target),
        "target_parameters": None,
        "hidden_size": H,
        "vocab_size": V,
        "num_layers": cfg.num_layers,
        "K": cfg.K,
        "train_continuations": len(tr_seqs),
        "train_positions": len(tr_pos),
        "positions_seen": seen,
        "steps": step,
        "data_minutes": data_minutes,
        "train_minutes": train_minutes,
        "total_minutes": (time.time() - t0) / 60,
        "eval_init": init,
        "eval": final,
        "config": asdict(cfg),
        "history": history,
    }
    try:
        summary["target_parameters"] = json.loads((Path(cfg.target) / "training_summary.json").read_text())["parameters"]
    except (OSError, ValueError, KeyError):
        pass
    (out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("=" * 72)
    print(f"[drafter] saved to {out}: {n_params:,} parameters (bf16), {step} steps, {seen:,} positions seen")
    print(f"[drafter] data {data_minutes:.1f} min, training {train_minutes:.1f} min, total {summary['total_minutes']:.1f} min")
    print(f"[drafter] heldout greedy continuations, {final['positions']:,} positions:")
    for k, (a, kl) in enumerate(zip(final["agreement_per_step"], final["kl_per_step"]), 1):
        print(f"[drafter]   step {k}: top-1 agreement {a:.4f}  KL {kl:.3f}")
    for key, v in final.items():
        if "tokens_per_step" in key:
            print(f"[drafter]   {key}: {v:.3f}")
    return summary


# --------------------------------------------------------------------------------------------
# CLI


def add_args(p: argparse.ArgumentParser) -> None:
    d = DistillConfig()
    p.add_argument("--target", default=d.target,
                   help="target: a folder, 'tiny' (the package's checkpoints/target) or 'smollm2-135m-instruct'")
    p.add_argument("--out", default=d.out, help="output folder (default: the package's checkpoint for the target)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--minutes", type=float, default=None,
                   help="total budget: data generation + training + evaluation (chat targets: training + "
                   "evaluation; --data-minutes bounds their data generation)")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--num-layers", type=int, default=d.num_layers)
    p.add_argument("--K", type=int, default=d.K, help="look-ahead steps trained")
    p.add_argument("--prompt-tokens", type=int, default=d.prompt_tokens)
    p.add_argument("--gen-tokens", type=int, default=d.gen_tokens)
    p.add_argument("--gen-batch", type=int, default=d.gen_batch)
    p.add_argument("--num-seqs", type=int, default=d.num_seqs)
    p.add_argument("--data-frac", type=float, default=d.data_frac)
    p.add_argument("--sample-frac", type=float, default=d.sample_frac)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--eval-seqs", type=int, default=d.eval_seqs)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--hard-weight", type=float, default=d.hard_weight)
    p.add_argument("--teacher-temperature", type=float, default=d.teacher_temperature,
                   help="sharpen (<1) the target's distributions used as soft labels")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--beam-width", type=int, default=d.beam_width)
    p.add_argument("--beam-length", type=int, default=d.beam_length)
    p.add_argument("--beam-eval-positions", type=int, default=d.beam_eval_positions)
    p.add_argument("--reserve-minutes", type=float, default=d.reserve_minutes)
    p.add_argument("--limit-files", type=int, default=None, help="use only the first N files of each split (tests)")
    p.add_argument("--corpus-root", default=None)
    g = p.add_argument_group("chat targets (e.g. --target smollm2-135m-instruct)")
    g.add_argument("--data", default=None, help="chat data folder (default: <cache>/distill/<target>); "
                   "generated there if empty, resumable")
    g.add_argument("--extra-data", default=None,
                   help="more chat data folders to train on, comma-separated (made by `chat-data --split broad`)")
    g.add_argument("--draft-vocab", type=int, default=d.draft_vocab,
                   help="drafter head over this many most frequent response tokens (0: full vocabulary)")
    g.add_argument("--chat-passes", default=d.chat_passes, help="temperature per pass over the prompts (0: greedy)")
    g.add_argument("--data-minutes", type=float, default=None, help="stop generating chat data after this long")
    g.add_argument("--regenerate-data", action="store_true")
    g.add_argument("--bf16", action="store_true",
                   help="bf16 autocast (faster only with AMX/avx512_bf16; 4x slower than float32 without)")
    g.add_argument("--save-every-minutes", type=float, default=d.save_every_minutes)


def config_from_args(a: argparse.Namespace) -> DistillConfig:
    return dataclass_from_args(DistillConfig, a)
