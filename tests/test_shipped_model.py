"""The shipped target + drafter: they load offline, agree with transformers, and ReDrafter's greedy
output equals plain greedy decoding on held-out prompts."""

from __future__ import annotations

import pytest
import torch

import redrafter_ext as rx
from redrafter_ext.demo import CHECKPOINTS, load_models, load_prompt_ids


@pytest.fixture(scope="module")
def shipped():
    for f in ("target/config.json", "target/model.safetensors", "target/tokenizer.json",
              "drafter/drafter_config.json", "drafter/drafter.safetensors"):
        assert (CHECKPOINTS / f).is_file(), f"shipped checkpoint file missing: {CHECKPOINTS / f}"
    target, drafter, tok, _ = load_models(CHECKPOINTS, random_weights=False)
    return target, drafter, tok


def test_shipped_target_matches_transformers(shipped):
    transformers = pytest.importorskip("transformers")
    target, _, tok = shipped
    hf = transformers.LlamaForCausalLM.from_pretrained(CHECKPOINTS / "target", dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode("def main(argv=None):\n    parser = ").ids])
    with torch.no_grad():
        want = hf(ids).logits
        kv = target.new_kv_cache(1, ids.shape[1])
        got, _ = target(ids, torch.arange(ids.shape[1])[None], rx.models.causal_tree_mask(torch.tensor([1]), ids.shape[1]),
                        torch.zeros(1, dtype=torch.int32), kv)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("W,L,B", [(4, 4, 1), (2, 5, 3)])
def test_shipped_greedy_identical_on_heldout_prompts(shipped, W, L, B):
    target, drafter, tok = shipped
    prompts = load_prompt_ids(tok, B, 160, target.vocab_size)
    eos = target.config.eos_token_id
    ar = rx.autoregressive_generate(target, prompts, 48, eos_id=eos)
    out = rx.generate(target, drafter, prompts, 48, beam_width=W, beam_length=L, eos_id=eos)
    assert out.tokens == ar.tokens
    assert out.tokens_per_step > 1.2  # the trained drafter is accepted well beyond chance
