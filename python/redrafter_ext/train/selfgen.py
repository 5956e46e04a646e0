"""Self-distilled data: the target's own answers to real requests, kept as token ids.

    python -m redrafter_ext.train selfgen --out data/selfgen/smollm2-135m-instruct --minutes 60

Prompts (``--sources``): the first human turn of ShareGPT conversations of the train split (by id
hash; at most ``--max-prompt-tokens`` templated tokens), the broad pool of everyday requests, the
template pool (``train/prompts.py``), their batches interleaved. Each is answered by the target with this package's own plain decoding
(``autoregressive_generate``: the target's exact greedy output in float32, or samples at ``--temperatures``), stopping at
EOS or ``--max-new-tokens``. ``--dtype bfloat16`` runs the target in bf16 (faster where the CPU has AMX; its greedy
answers can differ from float32's after a near-tie, which is fine for training data). A folder is resumed only with
the settings in its ``config.json`` that fix its job list and its answers (target, temperatures, lengths, batch, seed,
sources, dtype).

What is stored is what the target wrote and where its prompt comes from, never the prompt's text:
``part-XXXXX.npz`` (atomic; a rerun resumes with the next missing part) holds
``answer`` (sum of lengths,) uint16 token ids, ``length`` (N,) int32, ``temperature`` (N,) float32,
``source`` (N,) int8 (0 ShareGPT, 1 broad pool, 2 template pool, 3 ShareGPT's held-out slice) and ``key`` (N,) str (the ShareGPT id
or the index in its pool). About 2 MB per million tokens: the folder is committed so that data accumulates across
sessions and machines; ``records`` rebuilds ``(prompt ids, answer ids)`` with the tokenizer, and a
teacher-forced pass (``teacher --source FOLDER``) recomputes the hidden states.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

__all__ = ["SelfGenConfig", "generate", "records", "add_args", "config_from_args"]

# the index is what a part stores; sharegpt-heldout: the held-out slice's first turns (a yardstick, never trained on)
SOURCES = ("sharegpt", "broad", "templates", "sharegpt-heldout")


@dataclass
class SelfGenConfig:
    target: str = "smollm2-135m-instruct"
    out: str = ""
    temperatures: str = "0,0.7"  # one job list per temperature, interleaved
    max_new_tokens: int = 192
    max_prompt_tokens: int = 256
    batch: int = 32
    minutes: float | None = None
    max_parts: int | None = None
    seed: int = 0
    threads: int | None = None
    sources: str = "sharegpt,broad"  # prompt pools: sharegpt, broad, templates
    dtype: str = "float32"  # the target's: bfloat16 is 1.4-1.5x faster where the CPU has AMX (its greedy is not fp32's)


# what fixes a folder's job list and its answers: a resumed run must match them
_JOB_FIELDS = ("target", "temperatures", "max_new_tokens", "max_prompt_tokens", "batch", "seed", "sources", "dtype")
# folders made before a field was recorded in config.json were made with these values
_FIELDS_BEFORE_RECORDED = {"sources": "sharegpt,broad", "dtype": "float32"}
_DTYPES = ("float32", "bfloat16")


def _check_resume(out: Path, cfg: SelfGenConfig) -> None:
    """Refuse to resume ``out`` with settings that would change its job list or how its answers are made."""
    f = out / "config.json"
    if not f.is_file():
        return
    old = {**_FIELDS_BEFORE_RECORDED, **json.loads(f.read_text())}
    diff = [f"--{k.replace('_', '-')} {old.get(k)} (folder) vs {getattr(cfg, k)}" for k in _JOB_FIELDS
            if str(old.get(k)) != str(getattr(cfg, k))]
    if diff:
        raise ValueError(f"selfgen: {out} was made with other settings; resume it with the folder's own "
                         f"(see its config.json) or use a new --out: " + "; ".join(diff))


def _pools():
    from .prompts import broad_prompts, train_prompts

    return {"broad": broad_prompts, "templates": train_prompts}


def _prompt_pool(tok, max_prompt_tokens: int, sources: list[str]) -> list[tuple[int, str, list[int]]]:
    """``(source, key, prompt ids)`` in a fixed order: ShareGPT first turns (train split), then the
    broad pool, then the template pool (each when in ``sources``)."""
    from ..prompts import chat_prompt_ids
    from . import sharegpt

    bad = [x for x in sources if x not in SOURCES]
    if bad or not sources:
        raise ValueError(f"selfgen --sources: {','.join(bad) or 'none'}: choose among {', '.join(SOURCES)}")
    pool = []
    for split in ("sharegpt", "sharegpt-heldout"):
        for c in sharegpt.read_conversations() if split in sources else ():
            cid = str(c.get("id", ""))
            if sharegpt.is_heldout(cid) != (split == "sharegpt-heldout"):
                continue
            m = sharegpt.chat_messages(c)
            if not m or m[0]["role"] != "user" or len(m[0]["content"]) > 8 * max_prompt_tokens:
                continue
            ids = chat_prompt_ids(tok, m[0]["content"])
            if len(ids) <= max_prompt_tokens:
                pool.append((SOURCES.index(split), cid, ids))
    for name, texts in _pools().items():
        if name in sources:
            pool += [(SOURCES.index(name), str(i), chat_prompt_ids(tok, t)) for i, t in enumerate(texts())]
    return pool


def _jobs(pool, temps: list[float], batch: int, seed: int) -> list[tuple[float, list[int]]]:
    """Batches ``(temperature, pool indices)``, one stream per (source, temperature) merged in
    proportion to their sizes, each batch of similar prompt lengths (less prefill padding); the order
    is fixed by ``seed``, so a resumed run continues it."""
    rng = random.Random(seed)
    keyed = []
    for s in range(len(SOURCES)):
        idx = [i for i, p in enumerate(pool) if p[0] == s]
        for T in temps:
            rng.shuffle(idx)
            bs = []
            for w in range(0, len(idx), 8 * batch):  # sorted within windows of 8 batches: still spread over the pool
                ch = sorted(idx[w : w + 8 * batch], key=lambda i: len(pool[i][2]))
                bs += [ch[i : i + batch] for i in range(0, len(ch), batch)]
            keyed += [((k + 0.5) / len(bs), len(keyed) + k, (T, b)) for k, b in enumerate(bs)]
    return [j for _, _, j in sorted(keyed)]


def generate(cfg: SelfGenConfig) -> Path:
    """Generate (or resume) the parts of ``cfg.out``; returns that folder."""
    import torch

    from ..decode import autoregressive_generate
    from ..hub import load_model
    from .common import start_job

    if not cfg.out:
        raise ValueError("selfgen: --out is required")
    if cfg.dtype not in _DTYPES:
        raise ValueError(f"selfgen --dtype: {cfg.dtype!r}: choose among {', '.join(_DTYPES)}")
    out = Path(cfg.out)
    _check_resume(out, cfg)
    start_job(cfg.threads)
    out.mkdir(parents=True, exist_ok=True)
    target, _, tok = load_model(cfg.target, dtype=getattr(torch, cfg.dtype))
    eos = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else tok.eos_token_id
    temps = [float(x) for x in cfg.temperatures.split(",")]
    pool = _prompt_pool(tok, cfg.max_prompt_tokens, cfg.sources.split(","))
    jobs = _jobs(pool, temps, cfg.batch, cfg.seed)
    (out / "config.json").write_text(json.dumps({**asdict(cfg), "eos": int(eos), "prompts": len(pool),
                                                 "jobs": len(jobs)}, indent=2) + "\n")
    total = len(jobs) if cfg.max_parts is None else min(len(jobs), cfg.max_parts)
    bar = tqdm(total=total, desc="selfgen", unit="part", dynamic_ncols=True)
    t0, n_tok = time.time(), 0
    for j, (T, idx) in enumerate(jobs[:total]):
        part = out / f"part-{j:05d}.npz"
        if part.exists():
            bar.update(1)
            continue
        if cfg.minutes is not None and time.time() - t0 > cfg.minutes * 60:
            tqdm.write(f"[selfgen] time budget used up at part {j} of {len(jobs)}")
            break
        rows = [pool[i][2] for i in idx]
        res = autoregressive_generate(target, rows, cfg.max_new_tokens, eos_id=int(eos), temperature=T,
                                      seed=cfg.seed * 1_000_003 + j)
        answers = [np.asarray(a, dtype=np.uint16) for a in res.tokens]
        tmp = part.with_suffix(".tmp")  # not matched by part-*.npz while it is written
        with open(tmp, "wb") as f:
            np.savez_compressed(
                f, answer=np.concatenate(answers), length=np.array([len(a) for a in answers], dtype=np.int32),
                temperature=np.full(len(idx), T, dtype=np.float32),
                source=np.array([pool[i][0] for i in idx], dtype=np.int8), key=np.array([pool[i][1] for i in idx]))
        os.replace(tmp, part)
        n_tok += sum(map(len, answers))
        el = time.time() - t0
        bar.update(1)
        bar.set_postfix(tokens=n_tok, tok_s=f"{n_tok / el:.0f}", T=T)
        tqdm.write(f"[selfgen] part {j}: T={T} {sum(map(len, answers))} tokens, {n_tok} this run in {el / 60:.1f} min "
                   f"({n_tok / el:.0f} tok/s), load {os.getloadavg()[0]:.1f}")
    bar.close()
    return out


def records(folder: str | Path, tok, max_prompt_tokens: int | None = None) -> list[dict]:
    """``[{"prompt": ids, "answer": ids, "temperature": T, "source": s, "key": k}, ...]`` of every part,
    the prompts rebuilt from their sources with ``tok``'s chat template."""
    from ..prompts import chat_prompt_ids

    parts = [p for p in sorted(Path(folder).glob("part-*.npz")) if ".tmp" not in p.name]
    if not parts:
        raise FileNotFoundError(f"selfgen: no part-*.npz files in {folder}")
    share = None
    pools: dict[int, list[str]] = {}
    recs = []
    for p in parts:
        z = np.load(p)
        ends = np.cumsum(z["length"])
        for r in range(len(z["length"])):
            src, key = int(z["source"][r]), str(z["key"][r])
            if SOURCES[src].startswith("sharegpt"):
                if share is None:
                    from . import sharegpt

                    share = {}
                    for c in sharegpt.read_conversations():
                        m = sharegpt.chat_messages(c)
                        if m and m[0]["role"] == "user":
                            share[str(c.get("id", ""))] = m[0]["content"]
                text = share[key]
            else:
                if src not in pools:
                    pools[src] = _pools()[SOURCES[src]]()
                text = pools[src][int(key)]
            a = z["answer"][ends[r] - z["length"][r] : ends[r]].astype(np.int64).tolist()
            recs.append({"prompt": chat_prompt_ids(tok, text), "answer": a, "temperature": float(z["temperature"][r]),
                         "source": SOURCES[src], "key": key})
    return recs


def add_args(p: argparse.ArgumentParser) -> None:
    d = SelfGenConfig()
    p.add_argument("--target", default=d.target)
    p.add_argument("--out", required=True, help="folder of part files (resumable; commit it)")
    p.add_argument("--temperatures", default=d.temperatures, help="comma-separated (0: greedy)")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--minutes", type=float, default=None, help="stop starting new parts after this long")
    p.add_argument("--max-parts", type=int, default=None)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default=d.dtype, choices=_DTYPES,
                   help="the target's (bfloat16 where the CPU has AMX: ~1.5x float32's tokens/s at --batch 64)")
    p.add_argument("--sources", default=d.sources, help="prompt pools, comma-separated: sharegpt (first turns of the "
                   "train split), broad (everyday requests), templates (subjects x task templates), sharegpt-heldout "
                   "(first turns of the held-out slice: a yardstick)")


def config_from_args(a: argparse.Namespace) -> SelfGenConfig:
    from .common import dataclass_from_args

    return dataclass_from_args(SelfGenConfig, a)
