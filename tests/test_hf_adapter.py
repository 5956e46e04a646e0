"""The transformers adapter: a Hugging Face LlamaForCausalLM as the decode_step target.

ReDrafter over ``HFTarget`` reproduces ``transformers`` greedy ``generate`` token for token on the
shipped checkpoint (float32, batch 1 and 3 with mixed prompt lengths), the tree write lands in the
caller's cache in place, and the engine-loop example of docs/integration.md runs as written.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import redrafter_ext as rx
from redrafter_ext.demo import CHECKPOINTS, load_prompt_ids

transformers = pytest.importorskip("transformers")
from redrafter_ext.adapters.hf import HFTarget, KVViewCache, tree_attention_mask  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "integration.md"


@pytest.fixture(scope="module")
def models():
    hft = HFTarget.from_pretrained(CHECKPOINTS / "target", dtype=torch.float32)
    ours = rx.LlamaTarget.from_pretrained(CHECKPOINTS / "target", dtype=torch.float32)
    drafter = rx.Drafter.from_pretrained(CHECKPOINTS / "drafter")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(CHECKPOINTS / "target" / "tokenizer.json"))
    # mixed lengths: 23, full, 41 tokens
    p = load_prompt_ids(tok, 3, 160, hft.vocab_size)
    prompts = [p[0][:23], p[1], p[2][:41]]
    assert len({len(x) for x in prompts}) == 3
    return hft, ours, drafter, prompts


def hf_greedy(model, prompt: list[int], max_new: int, eos: int) -> list[int]:
    """transformers' own greedy generate at batch 1 (no padding), new tokens only."""
    ids = torch.tensor([prompt])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                         eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt):].tolist()


def random_tree(B: int, N: int, g: torch.Generator):
    parent = torch.full((B, N), -1, dtype=torch.int32)
    for b in range(B):
        for n in range(1, N):
            parent[b, n] = int(torch.randint(0, n, (1,), generator=g))
    return rx.reference.tree_mask(parent, torch.full((B,), N, dtype=torch.int32)), parent


def test_mask_matches_naive_definition():
    g = torch.Generator().manual_seed(0)
    B, T, S = 3, 5, 17
    tree, _ = random_tree(B, T, g)
    cache_len = torch.tensor([0, 4, 12], dtype=torch.int32)
    m = tree_attention_mask(tree, cache_len, S, torch.float32)
    assert m.shape == (B, 1, T, S) and m.dtype == torch.float32
    for b in range(B):
        c = int(cache_len[b])
        for t in range(T):
            for s in range(S):
                vis = s < c or (c <= s < c + T and bool(tree[b, t, s - c]))
                assert float(m[b, 0, t, s]) == (0.0 if vis else torch.finfo(torch.float32).min)


@pytest.mark.parametrize("B,T", [(1, 1), (3, 7)])
def test_tree_forward_matches_llama_target_and_writes_in_place(models, B, T):
    hft, ours, _, _ = models
    g = torch.Generator().manual_seed(B * 10 + T)
    S = 40
    tree, parent = random_tree(B, T, g)
    depth = torch.zeros(B, T, dtype=torch.int32)
    for n in range(1, T):
        depth[:, n] = depth.gather(1, parent[:, n : n + 1].clamp(min=0).long())[:, 0] + 1
    cache_len = torch.tensor([5, 0, 31][:B], dtype=torch.int32)
    tokens = torch.randint(0, hft.vocab_size, (B, T), generator=g)
    pos = cache_len[:, None] + depth
    kv0 = torch.randn(hft.new_kv_cache(B, S).shape, generator=g)
    kv_hf, kv_ours = kv0.clone(), kv0.clone()
    ptr = kv_hf.data_ptr()
    lh, hh = hft(tokens, pos, tree, cache_len, kv_hf)
    lo, ho = ours(tokens, pos, tree, cache_len, kv_ours)
    assert kv_hf.data_ptr() == ptr
    assert lh.dtype == torch.float32 and lh.shape == (B, T, hft.vocab_size) and hh.shape == (B, T, hft.hidden_size)
    torch.testing.assert_close(lh, lo, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(hh, ho, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(kv_hf, kv_ours, atol=1e-5, rtol=1e-5)
    # the write is exactly slots cache_len .. cache_len+T-1 of each row; the rest is bytewise intact
    for b in range(B):
        c = int(cache_len[b])
        keep = torch.ones(S, dtype=torch.bool)
        keep[c : c + T] = False
        assert torch.equal(kv_hf[:, :, b, :, keep], kv0[:, :, b, :, keep])
        assert not torch.equal(kv_hf[:, :, b, :, c : c + T], kv0[:, :, b, :, c : c + T])


@pytest.mark.parametrize("T,force_gqa,copies", [(7, False, 2), (7, True, 0), (1, False, 0)])
def test_documented_kv_materialisation(models, monkeypatch, T, force_gqa, copies):
    """The K/V copy docs/integration.md names: repeat_kv of K and V per layer for a tree (T > 1)
    with grouped heads, none with TRANSFORMERS_SDPA_FORCE_GQA=1 or at T = 1; same results."""
    from transformers.integrations import sdpa_attention

    hft, ours, _, _ = models
    assert hft.config.num_attention_heads > hft.config.num_key_value_heads  # grouped heads: the copying case
    calls = []
    real = sdpa_attention.repeat_kv

    def counting(x, n_rep):
        out = real(x, n_rep)
        calls.append(out.data_ptr() != x.data_ptr())
        return out

    monkeypatch.setattr(sdpa_attention, "repeat_kv", counting)
    monkeypatch.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "1" if force_gqa else "0")
    g = torch.Generator().manual_seed(T)
    B, S = 2, 24
    tree, parent = random_tree(B, T, g)
    cache_len = torch.tensor([3, 11], dtype=torch.int32)
    tokens = torch.randint(0, hft.vocab_size, (B, T), generator=g)
    pos = cache_len[:, None] + torch.arange(T)  # positions need not be depths for this check
    kv0 = torch.randn(hft.new_kv_cache(B, S).shape, generator=g)
    kv_hf, kv_ours = kv0.clone(), kv0.clone()
    lh, _ = hft(tokens, pos, tree, cache_len, kv_hf)
    lo, _ = ours(tokens, pos, tree, cache_len, kv_ours)
    torch.testing.assert_close(lh, lo, atol=2e-4, rtol=2e-4)
    assert sum(calls) == copies * hft.config.num_hidden_layers


def test_cache_views_alias_the_caller_tensor(models):
    hft = models[0]
    kv = hft.new_kv_cache(2, 12)
    cache = KVViewCache(kv, torch.tensor([3, 7], dtype=torch.int32), 2)
    assert len(cache.layers) == kv.shape[0]
    k_new = torch.ones(2, kv.shape[3], 2, kv.shape[5])
    k, v = cache.update(k_new, 2 * k_new, 1)
    assert k.data_ptr() == kv[1, 0].data_ptr() and v.data_ptr() == kv[1, 1].data_ptr()
    assert k.shape == kv[1, 0].shape
    assert torch.equal(kv[1, 0, 0, :, 3:5], k_new[0]) and torch.equal(kv[1, 1, 1, :, 7:9], 2 * k_new[1])
    assert int((kv != 0).sum()) == 2 * 2 * kv.shape[3] * 2 * kv.shape[5]


def test_bad_inputs_raise(models):
    hft = models[0]
    kv = hft.new_kv_cache(1, 8, dtype=torch.bfloat16)
    one = torch.zeros(1, 1, dtype=torch.int64)
    with pytest.raises(TypeError, match="kv dtype"):
        hft(one, one, torch.ones(1, 1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.int32), kv)
    with pytest.raises(ValueError, match="kv must have shape"):
        hft(one, one, torch.ones(1, 1, 1, dtype=torch.bool), torch.zeros(1, dtype=torch.int32), kv[:, :, :, :1].float())
    # a stand-in: loading a real model with flash attention needs the flash-attn package
    fake = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(ValueError, match="attention implementation"):
        HFTarget(fake)


@pytest.mark.parametrize("rows,W,L", [((0,), 1, 8), ((0, 1, 2), 1, 8), ((0, 1, 2), 2, 5)])
def test_generate_equals_transformers_greedy(models, rows, W, L):
    hft, _, drafter, prompts = models
    prompts = [prompts[r] for r in rows]
    max_new, eos = 40, hft.config.eos_token_id
    want = [hf_greedy(hft.model, p, max_new, eos) for p in prompts]
    out = rx.generate(hft, drafter, prompts, max_new, beam_width=W, beam_length=L, eos_id=eos)
    assert out.tokens == want
    assert out.tokens_per_step > 1.5  # the drafter is accepted through the adapter too


def test_generate_equals_transformers_greedy_with_eos_hit(models):
    """An EOS that rows hit at different steps (a frequent token chosen from HF's own output)."""
    hft, _, drafter, prompts = models
    free = [hf_greedy(hft.model, p, 40, hft.config.eos_token_id) for p in prompts]
    eos = free[1][12]
    want = [hf_greedy(hft.model, p, 40, eos) for p in prompts]
    assert len(want[1]) <= 13 and want[1][-1] == eos
    out = rx.generate(hft, drafter, prompts, 40, beam_width=1, beam_length=8, eos_id=eos)
    assert out.tokens == want


def test_docs_example_runs(models):
    """The engine loop of docs/integration.md, executed as written, matches ``generate``."""
    text = DOCS.read_text()
    m = re.search(r"<!-- example: engine loop -->\s*```python\n(.*?)```", text, re.S)
    assert m, "docs/integration.md lacks the tested engine-loop example"
    ns: dict = {}
    exec(compile(m.group(1), str(DOCS), "exec"), ns)  # noqa: S102  (our own documentation)
    hft, _, drafter, _ = models
    want = rx.generate(ns["target"], ns["drafter"], ns["prompts"], ns["max_new_tokens"], beam_width=ns["W"],
                       beam_length=ns["L"], eos_id=ns["eos"])
    assert ns["outputs"] == want.tokens
    assert len(ns["outputs"]) == len(ns["prompts"]) >= 2


def test_adapters_reachable_from_the_package():
    # README's `rx.adapters.hf.HFTarget` works after a plain `import redrafter_ext`, loaded lazily
    import subprocess
    import sys

    code = ("import sys, redrafter_ext as rx; assert 'redrafter_ext.adapters.hf' not in sys.modules; "
            "print(rx.adapters.hf.HFTarget.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "HFTarget", r.stderr[-2000:]
