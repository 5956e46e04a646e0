"""Stage 1: a byte-level BPE tokenizer and a small Llama target LM trained from scratch.

    python -m redrafter_ext.train target --minutes 55

The corpus is the interpreter's own standard library (``redrafter_ext.corpus``). Sequences are random
windows of ``seq_len + 1`` tokens from the packed train stream (files separated by
``<|endoftext|>``). AdamW, linear warmup then cosine decay; with ``--minutes`` the schedule runs
on the fraction of the time budget used (so it decays fully when the budget ends), with
``--max-steps`` on the step count (the larger of the two fractions when both are given).
The final model is saved in bfloat16 with ``save_pretrained`` next to the tokenizer files and a
``training_summary.json``.

Training runs in float32: on CPUs without native bf16 matmuls (AVX2-only), bf16 autocast is
~20x slower than float32; ``--bf16`` turns it on where it pays (AMX / AVX512-BF16).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import corpus
from .common import StepLoop, adamw, dataclass_from_args, optimizer_step, start_job

__all__ = ["TargetTrainConfig", "add_args", "config_from_args", "load_tokenizer", "train", "train_tokenizer"]

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "checkpoints" / "target"


@dataclass
class TargetTrainConfig:
    out: str = str(DEFAULT_OUT)
    seed: int = 0
    minutes: float | None = None  # wall-clock budget for the optimisation loop
    max_steps: int | None = None
    # tokenizer
    vocab_size: int = 4096
    # model
    hidden_size: int = 384
    num_layers: int = 6
    intermediate_size: int = 1024
    num_heads: int = 6
    num_kv_heads: int = 2
    max_position_embeddings: int = 1024
    # optimisation
    seq_len: int = 256
    batch_size: int = 8
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    bf16: bool = False
    threads: int | None = None
    # evaluation / checkpoints
    eval_every: int = 200
    eval_windows: int = 128
    save_every_minutes: float = 10.0
    num_samples: int = 3
    sample_tokens: int = 64
    # data subset (tests)
    limit_train_files: int | None = None
    limit_val_files: int | None = None
    corpus_root: str | None = None
    extra: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts, vocab_size: int, out: Path):
    """Byte-level BPE on ``texts``; saves tokenizer.json (+ config files) into ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[corpus.EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=corpus.EOS_TOKEN,
        eos_token=corpus.EOS_TOKEN,
        unk_token=corpus.EOS_TOKEN,
        pad_token=corpus.EOS_TOKEN,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    return fast


def load_tokenizer(folder: str | Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def encode_split(tok, split: str, limit_files: int | None, root: str | None) -> torch.Tensor:
    """All files of ``split``, each preceded by EOS, concatenated into one int32 stream."""
    texts = list(corpus.iter_texts(split, root=root, limit_files=limit_files))
    eos = tok.convert_tokens_to_ids(corpus.EOS_TOKEN)
    ids: list[int] = []
    for enc in tok.backend_tokenizer.encode_batch(texts):
        ids.append(eos)
        ids.extend(enc.ids)
    ids.append(eos)
    return torch.tensor(ids, dtype=torch.int32)


# --------------------------------------------------------------------------------------------
# model


def build_model(cfg: TargetTrainConfig, vocab_size: int, eos_id: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    mcfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        initializer_range=0.02,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        use_cache=True,
    )
    model = LlamaForCausalLM(mcfg)
    model.generation_config.bos_token_id = eos_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = eos_id
    model.generation_config.do_sample = False
    return model


def sample_batch(stream: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)[None, :]
    return stream[idx].long()


def val_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    n = min(max_windows, (len(stream) - 1) // seq_len)
    n = max(n, 1)
    if len(stream) < seq_len + 1:
        raise ValueError("validation stream shorter than one window")
    return torch.stack([stream[i * seq_len : i * seq_len + seq_len + 1] for i in range(n)]).long()


@torch.no_grad()
def evaluate(model, windows: torch.Tensor, bf16: bool, batch: int = 16) -> float:
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(windows), batch):
        w = windows[i : i + batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(input_ids=w[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += w[:, 1:].numel()
    model.train()
    return total / count


@torch.no_grad()
def greedy_samples(model, tok, prompts: list[str], max_new_tokens: int) -> list[dict]:
    model.eval()
    out = []
    for p in prompts:
        ids = tok(p, return_tensors="pt").input_ids
        gen = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=model.config.pad_token_id,
        )
        out.append({"prompt": p, "continuation": tok.decode(gen[0, ids.shape[1] :])})
    return out


def save_bf16(model, tok, out: Path) -> None:
    """Save a bfloat16 copy (safetensors) of ``model`` plus tokenizer files into ``out``."""
    import copy

    out.mkdir(parents=True, exist_ok=True)
    m = copy.deepcopy(model).to(torch.bfloat16)
    m.config.use_cache = True
    m.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))


def _set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


# --------------------------------------------------------------------------------------------
# training


def train(cfg: TargetTrainConfig) -> dict:
    start_job(cfg.threads)
    _set_seed(cfg.seed)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()

    print(f"[target] corpus: {corpus.stdlib_root() if cfg.corpus_root is None else cfg.corpus_root}", flush=True)
    train_texts = list(corpus.iter_texts("train", root=cfg.corpus_root, limit_files=cfg.limit_train_files))
    tok = train_tokenizer(train_texts, cfg.vocab_size, out)
    del train_texts
    vocab = len(tok)
    eos_id = tok.convert_tokens_to_ids(corpus.EOS_TOKEN)
    train_stream = encode_split(tok, "train", cfg.limit_train_files, cfg.corpus_root)
    val_stream = encode_split(tok, "val", cfg.limit_val_files, cfg.corpus_root)
    print(
        f"[target] tokenizer: vocab {vocab}, train {len(train_stream):,} tokens, val {len(val_stream):,} tokens "
        f"({time.time() - t_start:.0f}s)",
        flush=True,
    )
    vwin = val_windows(val_stream, cfg.seq_len, cfg.eval_windows)

    model = build_model(cfg, vocab, eos_id)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"[target] LlamaForCausalLM {n_params / 1e6:.2f}M parameters", flush=True)
    opt = adamw(model.parameters(), cfg.lr, cfg.weight_decay, (0.9, 0.95))
    gen = torch.Generator().manual_seed(cfg.seed)
    budget = cfg.minutes * 60.0 if cfg.minutes else None
    if budget is None and cfg.max_steps is None:
        raise ValueError("give --minutes and/or --max-steps")

    model.train()
    tokens_seen = 0
    history: list[dict] = []
    ema = None
    loop = StepLoop(cfg, opt, budget)
    t_loop = last_save = loop.start
    for lr in loop:
        batch = sample_batch(train_stream, cfg.batch_size, cfg.seq_len, gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
            logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, vocab), batch[:, 1:].reshape(-1))
        gnorm = optimizer_step(loss, model.parameters(), opt, cfg.grad_clip)
        tokens_seen += batch[:, 1:].numel()
        li = loss.item()
        ema = li if ema is None else 0.98 * ema + 0.02 * li
        loop.done(loss=f"{ema:.3f}", lr=f"{lr:.2e}", tok=f"{tokens_seen / 1e6:.2f}M")
        step = loop.step
        if step % cfg.eval_every == 0:
            vl = evaluate(model, vwin, cfg.bf16)
            rec = {"step": step, "tokens": tokens_seen, "train_loss_ema": ema, "val_loss": vl, "lr": lr,
                   "grad_norm": float(gnorm), "minutes": (time.time() - t_loop) / 60}
            history.append(rec)
            tqdm.write(f"[target] step {step} tokens {tokens_seen:,} train {ema:.4f} val {vl:.4f} ppl {math.exp(vl):.2f} lr {lr:.2e}")
        if time.time() - last_save > cfg.save_every_minutes * 60:
            save_bf16(model, tok, out)
            last_save = time.time()
            tqdm.write(f"[target] checkpoint saved to {out} at step {step}")
    step = loop.step
    train_minutes = loop.minutes

    save_bf16(model, tok, out)
    # final numbers on the shipped bf16 weights, reloaded from disk
    from transformers import LlamaForCausalLM

    shipped = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    val_loss = evaluate(shipped, vwin, cfg.bf16)
    prompts = corpus.load_prompts(cfg.num_samples, 200, seed=cfg.seed, root=cfg.corpus_root) if cfg.num_samples else []
    samples = greedy_samples(shipped, tok, prompts, cfg.sample_tokens)
    summary = {
        "parameters": n_params,
        "vocab_size": vocab,
        "tokens_seen": tokens_seen,
        "steps": step,
        "train_tokens_in_corpus": len(train_stream),
        "epochs": tokens_seen / max(len(train_stream), 1),
        "val_loss": val_loss,
        "val_perplexity": math.exp(val_loss),
        "val_tokens": int(vwin[:, 1:].numel()),
        "train_loss_ema": ema,
        "train_minutes": train_minutes,
        "total_minutes": (time.time() - t_start) / 60,
        "config": asdict(cfg),
        "torch": torch.__version__,
        "history": history,
        "samples": samples,
    }
    (out / "training_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("=" * 72)
    print(f"[target] saved to {out}")
    print(f"[target] parameters {n_params:,}  tokens seen {tokens_seen:,} ({summary['epochs']:.2f} epochs, {step} steps)")
    print(f"[target] val loss {val_loss:.4f}  perplexity {math.exp(val_loss):.2f}  ({train_minutes:.1f} min training)")
    for s in samples:
        print("-" * 72)
        print(s["prompt"] + "\033[1m" + s["continuation"] + "\033[0m" if os.isatty(1) else s["prompt"] + "<<<" + s["continuation"] + ">>>")
    return summary


# --------------------------------------------------------------------------------------------
# CLI


def add_args(p: argparse.ArgumentParser) -> None:
    d = TargetTrainConfig()
    p.add_argument("--out", default=d.out, help="output folder (default: the package's checkpoints/target)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--minutes", type=float, default=None, help="wall-clock budget of the training loop")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--vocab-size", type=int, default=d.vocab_size)
    p.add_argument("--hidden-size", type=int, default=d.hidden_size)
    p.add_argument("--num-layers", type=int, default=d.num_layers)
    p.add_argument("--intermediate-size", type=int, default=d.intermediate_size)
    p.add_argument("--num-heads", type=int, default=d.num_heads)
    p.add_argument("--num-kv-heads", type=int, default=d.num_kv_heads)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup-steps", type=int, default=d.warmup_steps)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (fast only with AMX / AVX512-BF16)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-windows", type=int, default=d.eval_windows)
    p.add_argument("--save-every-minutes", type=float, default=d.save_every_minutes)
    p.add_argument("--num-samples", type=int, default=d.num_samples)
    p.add_argument("--sample-tokens", type=int, default=d.sample_tokens)
    p.add_argument("--limit-train-files", type=int, default=None, help="use only the first N train files (tests)")
    p.add_argument("--limit-val-files", type=int, default=None)
    p.add_argument("--corpus-root", default=None, help="another stdlib-like tree of .py files")


def config_from_args(a: argparse.Namespace) -> TargetTrainConfig:
    return dataclass_from_args(TargetTrainConfig, a)
