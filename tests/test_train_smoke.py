"""Smoke test of the training pipeline: both stages on a tiny model and a tiny corpus subset.

Runs the same code as ``python -m redrafter_ext.train {target,drafter}`` (CPU only, no native
extension), then checks that the outputs load with transformers and ``Drafter.from_pretrained``.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

import redrafter_ext as rx
from redrafter_ext import corpus
from redrafter_ext.drafter import Drafter
from redrafter_ext.train import distill, target


def test_corpus_splits_and_prompts():
    files = corpus.corpus_files()
    assert files, "empty stdlib corpus"
    assert [f.rel for f in files] == sorted(f.rel for f in files)
    splits = {f.split for f in files}
    assert splits <= set(corpus.SPLITS) and "train" in splits
    assert not any("/test/" in f"/{f.rel}" or "site-packages" in f.rel for f in files)
    a = corpus.load_prompts(5, 200, seed=0)
    assert a == corpus.load_prompts(5, 200, seed=0)
    assert len(a) == 5 and all(0 < len(p) <= 200 and p.endswith("\n") for p in a)
    held = {corpus.read_text(f) for f in corpus.corpus_files("heldout")}
    assert all(any(p in t for t in held) for p in a)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    tcfg = target.TargetTrainConfig(
        out=str(root / "target"), seed=0, max_steps=4, vocab_size=300, hidden_size=32, num_layers=1,
        intermediate_size=64, num_heads=2, num_kv_heads=1, seq_len=32, batch_size=4, warmup_steps=2,
        eval_every=2, eval_windows=4, num_samples=1, sample_tokens=4, limit_train_files=3, limit_val_files=1,
    )
    tsum = target.train(tcfg)
    dcfg = distill.DistillConfig(
        target=tcfg.out, out=str(root / "drafter"), seed=0, max_steps=4, num_layers=1, K=3,
        prompt_tokens=8, gen_tokens=12, gen_batch=4, num_seqs=8, eval_seqs=2, batch_size=16,
        warmup_steps=1, eval_every=2, beam_width=2, beam_length=3, beam_eval_positions=16, limit_files=3,
    )
    dsum = distill.train(dcfg)
    return root, tsum, dsum


def test_target_outputs_load(trained):
    from transformers import AutoTokenizer, LlamaForCausalLM

    root, tsum, _ = trained
    folder = root / "target"
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json", "training_summary.json"):
        assert (folder / name).is_file(), name
    model = LlamaForCausalLM.from_pretrained(str(folder))
    assert model.dtype == torch.bfloat16
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert model.config.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(str(folder))
    eos = tok.convert_tokens_to_ids(corpus.EOS_TOKEN)
    assert tok.eos_token_id == eos == model.config.eos_token_id
    text = "def f(x):\n    return x\n"
    assert tok.decode(tok(text).input_ids) == text
    assert len(tok) <= model.config.vocab_size
    summary = json.loads((folder / "training_summary.json").read_text())
    assert summary["tokens_seen"] == tsum["tokens_seen"] == 4 * 4 * 32
    assert math.isfinite(summary["val_loss"]) and summary["parameters"] > 0
    assert len(summary["samples"]) == 1


def test_drafter_outputs_load(trained):
    from transformers import LlamaForCausalLM

    root, _, dsum = trained
    from safetensors.torch import load_file

    assert all(v.dtype == torch.bfloat16 for v in load_file(str(root / "drafter" / "drafter.safetensors")).values())
    d = Drafter.from_pretrained(root / "drafter")
    model = LlamaForCausalLM.from_pretrained(str(root / "target"), dtype=torch.float32)
    assert d.config.hidden_size == model.config.hidden_size
    assert d.config.vocab_size == model.config.vocab_size
    ev = dsum["eval"]
    assert len(ev["agreement_per_step"]) == 3
    assert all(0.0 <= a <= 1.0 for a in ev["agreement_per_step"])
    assert 1.0 <= ev["beam_tokens_per_step_W2_L3"] <= 3.0
    saved = json.loads((root / "drafter" / "training_summary.json").read_text())
    assert saved["steps"] == 4
    # the drafter runs on the target's hidden states
    ids = torch.tensor([[1, 2, 3, 4]])
    h = model.model(input_ids=ids).last_hidden_state[:, -1]
    beams = d.float().beam_search(h, torch.tensor([5]), model.get_input_embeddings().weight, 2, 3, rx.reference)
    assert beams.shape == (1, 2, 3) and (beams[:, :, 0] == 5).all()


def test_cli_help():
    from redrafter_ext.train.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
