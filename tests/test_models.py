"""The Llama target: Hugging Face parity, checkpoint round trip, tree forward == per-beam recompute."""

from __future__ import annotations

import pytest
import torch
from helpers import random_target

import redrafter_ext as rx
from redrafter_ext.models import LlamaTarget, causal_tree_mask

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    cfg = transformers.LlamaConfig(
        vocab_size=111, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=128,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    folder = tmp_path_factory.mktemp("hf")
    model.save_pretrained(folder)
    return folder, model


def test_matches_transformers(hf_folder):
    folder, hf = hf_folder
    ours = LlamaTarget.from_pretrained(folder)
    ids = torch.randint(0, 111, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = hf(ids).logits
        kv = ours.new_kv_cache(3, 16)
        got, _ = ours(ids, torch.arange(12).expand(3, 12), causal_tree_mask(torch.full((3,), 12), 12),
                      torch.zeros(3, dtype=torch.int32), kv)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_greedy_matches_transformers_generate(hf_folder):
    folder, hf = hf_folder
    ours = LlamaTarget.from_pretrained(folder)
    prompt = [5, 9, 2, 77, 31]
    with torch.no_grad():
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0, len(prompt):].tolist()
    assert rx.autoregressive_generate(ours, [prompt], 20).tokens[0] == want


def test_save_load_round_trip(tmp_path):
    model = random_target(seed=3)
    model.save_pretrained(tmp_path)
    again = LlamaTarget.from_pretrained(tmp_path)
    for (n1, p1), (n2, p2) in zip(model.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)
    hf = transformers.LlamaForCausalLM.from_pretrained(tmp_path)  # transformers reads it too
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        kv = model.new_kv_cache(1, 8)
        ours, _ = model(ids, torch.arange(4)[None], causal_tree_mask(torch.tensor([4]), 4),
                        torch.zeros(1, dtype=torch.int32), kv)
        torch.testing.assert_close(ours, hf(ids).logits, atol=1e-4, rtol=1e-4)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        LlamaTarget.from_pretrained(tmp_path)


def test_tree_forward_equals_per_beam_recompute():
    # every trie node's logits equal those of its beam's prefix run causally on the same cache
    target = random_target(seed=5)
    prompt = torch.tensor([[4, 8, 15, 16, 23, 42]])
    beams = torch.tensor([[[7, 1, 2, 3], [7, 1, 5, 6], [7, 9, 2, 3]]], dtype=torch.int32)
    tok, par, dep, bnode, nn = rx.reference.build_trie(beams)
    mask = rx.reference.tree_mask(par, nn)
    with torch.no_grad():
        kv = target.new_kv_cache(1, 32)
        target.prefill(prompt, torch.tensor([6]), kv)
        cache_len = torch.tensor([6], dtype=torch.int32)
        logits, _ = target(tok, cache_len[:, None] + dep, mask, cache_len, kv.clone())
        for w in range(3):
            kv_w = kv.clone()
            lw, _ = target(beams[:, w], torch.arange(6, 10)[None], causal_tree_mask(torch.tensor([4]), 4),
                           cache_len, kv_w)
            for d in range(4):
                torch.testing.assert_close(logits[0, bnode[0, w, d]], lw[0, d], atol=1e-5, rtol=1e-5)
