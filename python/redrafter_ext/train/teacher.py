"""Teacher-forced training data: the target read once over whole conversations, no generation.

    python -m redrafter_ext.train teacher --source sharegpt --out DIR --max-tokens 5000000

Each conversation is formatted with the target's chat template and run through the target in one
forward pass (batches of similar length, right-padded: causal attention leaves real positions
unaffected by padding after them). For every answer span (assistant content and its end-of-turn
token) a shard keeps the answer's tokens and the target's final-norm hidden state at each position
that predicts one of them; the target's next-token distribution is that hidden state times its tied
head, so it is recomputed from them during training and never stored.

Shard ``shard-XXXXX.pt`` (written atomically; a rerun resumes after the last complete one):
``{"tokens": (T,) int32, "hidden": (T, H) float16, "span_len": (S,) int64, "source": str}``:
span s covers ``span_len[s]`` consecutive entries; ``hidden[i]`` predicts ``tokens[i]`` (the
layout ``distill_chat.flatten`` reads). With ``--layers 10,20`` a shard also holds
``"layers": [10, 20]`` and ``"extra": (T, 2H) float16``, the outputs of those decoder layers at the
same positions (the residual stream, before any norm): conditioning for a multi-layer drafter. 1.2 kB a token at H = 576, so DIR holds ~1.2 GB per million
tokens: a scratch cache (never commit it), recomputable from the token ids.

Sources: ``sharegpt`` (the registry package, train split by id hash), ``sharegpt-heldout`` (its
held-out slice), or a folder of committed self-distilled token ids (``selfgen``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

__all__ = ["TeacherConfig", "parse_layers", "features", "encode_messages", "write_shards", "Shards", "add_args", "config_from_args"]


@dataclass
class TeacherConfig:
    target: str = "smollm2-135m-instruct"
    source: str = "sharegpt"  # sharegpt | sharegpt-heldout | a selfgen folder
    out: str = ""
    max_len: int = 1024  # tokens per conversation (longer ones are cut at a turn boundary or at this length)
    max_tokens: int | None = None  # stop after this many answer tokens in all shards
    shard_tokens: int = 100_000  # answer tokens per shard
    batch_tokens: int = 8192  # padded tokens per forward
    bf16: bool = True  # the forward in bfloat16 (labels for training: fine; 3-5x faster with AMX/avx512_bf16)
    threads: int | None = None
    minutes: float | None = None  # stop starting new shards after this long
    layers: str | None = None  # decoder layers (1-based) whose outputs a shard keeps too, e.g. "10,20"


def parse_layers(spec: str | list[int] | None, num_layers: int | None = None) -> list[int]:
    """``"10,20"`` -> ``[10, 20]``: distinct, increasing, each in ``[1, num_layers - 1]`` (the last
    layer's output is the final-norm state every shard holds anyway)."""
    if spec is None or spec == "" or spec == []:
        return []
    vals = [int(x) for x in spec.split(",")] if isinstance(spec, str) else [int(x) for x in spec]
    hi = None if num_layers is None else num_layers - 1
    if vals != sorted(set(vals)) or vals[0] < 1 or (hi is not None and vals[-1] > hi):
        raise ValueError(f"--layers {spec!r}: distinct increasing decoder layers in [1, {hi or 'L-1'}]")
    return vals


def encode_messages(tok, messages: list[dict], max_len: int) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of a conversation in the chat template and its answer spans ``[(start, end), ...]``
    (token indices: the assistant's content and end-of-turn token), cut to ``max_len`` tokens.

    Each turn is tokenized as the template renders it, the prefix through turn i minus the prefix
    through turn i-1: the template's turns begin at special tokens, so the pieces join exactly."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    prev = ""
    for i, m in enumerate(messages):
        if m["role"] == "assistant":
            head = tok.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False)
            a = tok.encode(head[len(prev):], add_special_tokens=False)
            ids += a
            prev = head
        text = tok.apply_chat_template(messages[: i + 1], tokenize=False)
        if not text.startswith(prev):
            raise ValueError("encode_messages: the chat template does not render turns as a prefix")
        piece = tok.encode(text[len(prev):], add_special_tokens=False)
        start = len(ids)
        ids += piece
        prev = text
        if m["role"] == "assistant":
            # the span ends at the end-of-turn token: what follows it (a newline) starts the next turn
            end = start + len(piece)
            eot = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else None
            if eot is not None and eot in piece:
                end = start + piece.index(eot) + 1
            spans.append((start, min(end, max_len)))
        if len(ids) >= max_len:
            break
    ids = ids[:max_len]
    return ids, [(s, e) for s, e in spans if e - s >= 2]


def _items(source: str, tok, max_len: int) -> Iterator[tuple[list[int], list[tuple[int, int]]]]:
    """``(ids, answer spans)`` of each conversation of a source (see the module docstring)."""
    if source in ("sharegpt", "sharegpt-heldout"):
        from . import sharegpt

        want = source == "sharegpt-heldout"
        for c in sharegpt.read_conversations():
            if sharegpt.is_heldout(c.get("id", "")) == want:
                m = sharegpt.chat_messages(c)
                if any(x["role"] == "assistant" for x in m):
                    yield encode_messages(tok, m, max_len)
        return
    if Path(source).is_dir():
        from . import selfgen

        # the stored ids themselves: re-encoding the decoded answer need not give the same tokens
        for r in selfgen.records(source, tok):
            ids = (r["prompt"] + r["answer"])[:max_len]
            P = len(r["prompt"])
            yield ids, ([(P, len(ids))] if len(ids) - P >= 2 else [])
        return
    raise ValueError(f"teacher: unknown source {source!r} (sharegpt, sharegpt-heldout, or a selfgen folder)")


def _batches(items: list[tuple[list[int], list[tuple[int, int]]]], batch_tokens: int):
    """Groups of similar length whose padded size stays within ``batch_tokens``."""
    order = sorted(range(len(items)), key=lambda i: len(items[i][0]))
    group: list[int] = []
    for i in order:
        n = len(items[i][0])
        if group and (len(group) + 1) * n > batch_tokens:
            yield group
            group = []
        group.append(i)
    if group:
        yield group


@torch.no_grad()
def features(model, rows: list[list[int]], dtype: torch.dtype, layers: list[int] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Final-norm hidden states ``(B, T, H)`` of right-padded ``rows`` (padding positions garbage) and,
    for ``layers``, the outputs of those decoder layers concatenated ``(B, T, len(layers) * H)``."""
    T = max(map(len, rows))
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
    got: dict[int, torch.Tensor] = {}
    # hooks rather than output_hidden_states: its indexing has changed between transformers versions
    hooks = [model.model.layers[k - 1].register_forward_hook(
        lambda _m, _i, out, k=k: got.__setitem__(k, out[0] if isinstance(out, tuple) else out)) for k in layers]
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            h = model.model(input_ids=ids).last_hidden_state
    finally:
        for x in hooks:
            x.remove()
    return h, (torch.cat([got[k] for k in layers], dim=-1) if layers else None)


def write_shards(cfg: TeacherConfig, items: Iterator[tuple[list[int], list[tuple[int, int]]]] | None = None) -> Path:
    """Write (or resume) the shards of ``cfg.source`` into ``cfg.out``; returns that folder.

    ``items``: ``(ids, answer spans)`` to read instead of ``cfg.source`` (the same sequence on a resume)."""
    from .common import load_target, start_job

    if not cfg.out:
        raise ValueError("teacher: --out is required")
    start_job(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model, tok, folder = load_target(cfg.target)
    layers = parse_layers(cfg.layers, model.config.num_hidden_layers)
    if cfg.bf16:
        model = model.to(torch.bfloat16)
    meta = {**asdict(cfg), "target_folder": str(folder)}
    (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    done = sorted(out.glob("shard-*.pt"))
    have = sum(Shards.count(p) for p in done)
    # shards hold consecutive conversations: skip those the finished shards consumed
    skip = sum(int(json.loads(p.with_suffix(".json").read_text())["conversations"]) for p in done)
    t0 = time.time()
    bar = tqdm(total=cfg.max_tokens, initial=have, unit="tok", unit_scale=True, desc="teacher", dynamic_ncols=True)
    convs = iter(items) if items is not None else _items(cfg.source, tok, cfg.max_len)
    for _ in range(skip):
        next(convs, None)
    j = len(done)
    exhausted = False
    while not exhausted and (cfg.max_tokens is None or have < cfg.max_tokens):
        if cfg.minutes is not None and time.time() - t0 > cfg.minutes * 60:
            tqdm.write(f"[teacher] time budget used up after {j} shards")
            break
        items, n_ans, n_conv = [], 0, 0
        for ids, spans in convs:
            n_conv += 1
            if spans:
                items.append((ids, spans))
                n_ans += sum(e - s for s, e in spans)
            if n_ans >= cfg.shard_tokens:
                break
        else:
            exhausted = True
        if not items:
            break
        toks, hids, extras, lens = [], [], [], []
        for group in _batches(items, cfg.batch_tokens):
            h, x = features(model, [items[i][0] for i in group], torch.bfloat16 if cfg.bf16 else torch.float32, layers)
            for b, i in enumerate(group):
                ids, spans = items[i]
                for s, e in spans:
                    # hidden at s-1 .. e-2 predicts tokens s .. e-1
                    toks.append(torch.tensor(ids[s:e], dtype=torch.int32))
                    hids.append(h[b, s - 1 : e - 1].to(torch.float16))
                    if x is not None:
                        extras.append(x[b, s - 1 : e - 1].to(torch.float16))
                    lens.append(e - s)
        shard = {"tokens": torch.cat(toks), "hidden": torch.cat(hids), "span_len": torch.tensor(lens),
                 "source": cfg.source}
        if layers:
            shard.update(layers=layers, extra=torch.cat(extras))
        part = out / f"shard-{j:05d}.pt"
        tmp = part.with_suffix(".tmp")
        torch.save(shard, tmp)
        part.with_suffix(".json").write_text(json.dumps({"conversations": n_conv, "tokens": len(shard["tokens"])}))
        os.replace(tmp, part)
        have += len(shard["tokens"])
        j += 1
        bar.update(len(shard["tokens"]))
        el = time.time() - t0
        bar.set_postfix(shards=j, load=f"{os.getloadavg()[0]:.1f}")
        tqdm.write(f"[teacher] shard {j - 1}: {len(shard['tokens']):,} answer tokens of {n_conv} conversations, "
                   f"{have:,} in all, {el / 60:.1f} min, load {os.getloadavg()[0]:.1f}")
    bar.close()
    return out


class Shards:
    """The shards of a folder, memory-mapped: training reads random windows without loading them."""

    def __init__(self, folder: str | Path, K: int) -> None:
        self.folder, self.K = Path(folder), K
        self.parts: list[dict] = []
        self.refresh()

    @staticmethod
    def count(path: Path) -> int:
        meta = path.with_suffix(".json")
        return int(json.loads(meta.read_text())["tokens"]) if meta.is_file() else 0

    def refresh(self) -> int:
        """Map shards written since the last call (a writer may run beside training); returns how many."""
        names = sorted(self.folder.glob("shard-*.pt"))
        new = names[len(self.parts):]
        for p in new:
            d = torch.load(p, mmap=True, weights_only=True)
            lens = d["span_len"]
            ends = torch.cumsum(lens, 0)
            # a start i is valid when i..i+K lie in one span (see distill_chat.flatten)
            st = [torch.arange(e - n, e - self.K) for n, e in zip(lens.tolist(), ends.tolist()) if n > self.K]
            d["starts"] = torch.cat(st) if st else torch.zeros(0, dtype=torch.long)
            self.parts.append(d)
        return len(new)

    @property
    def positions(self) -> int:
        return sum(len(d["starts"]) for d in self.parts)

    @property
    def tokens(self) -> int:
        return sum(len(d["tokens"]) for d in self.parts)


def add_args(p: argparse.ArgumentParser) -> None:
    d = TeacherConfig()
    p.add_argument("--target", default=d.target, help="model name or Hugging Face folder")
    p.add_argument("--source", default=d.source, help="sharegpt | sharegpt-heldout | a selfgen folder (prompt + stored answer)")
    p.add_argument("--out", required=True, help="shard folder (resumable; a scratch cache, ~1.2 GB per M tokens)")
    p.add_argument("--max-len", type=int, default=d.max_len, help="tokens per conversation at most")
    p.add_argument("--max-tokens", type=int, default=None, help="answer tokens in all shards at most")
    p.add_argument("--shard-tokens", type=int, default=d.shard_tokens)
    p.add_argument("--batch-tokens", type=int, default=d.batch_tokens)
    # the help names the flag's effect: argparse would print the dest's default (bf16=True) as "default: True"
    p.add_argument("--fp32", dest="bf16", action="store_false", default=argparse.SUPPRESS,
                   help="the forward in float32 instead of bfloat16 (bf16 is 3-5x faster with AMX/avx512_bf16, "
                   "~4x slower without)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--minutes", type=float, default=None, help="stop starting new shards after this long")
    p.add_argument("--layers", default=None, help="decoder layers (1-based, e.g. 10,20) whose outputs a shard keeps "
                   "too: conditioning for a multi-layer drafter (+1.2 kB a token each)")


def config_from_args(a: argparse.Namespace) -> TeacherConfig:
    from .common import dataclass_from_args

    return dataclass_from_args(TeacherConfig, a)
