"""The mlx-lm adapter: an unchanged mlx-lm Llama model as the target of the MLX ``decode_step``.

ReDrafter over ``MLXLMTarget`` reproduces mlx-lm's own greedy generation (``generate_step`` with its
argmax sampler, each prompt run alone) token for token on the shipped model (float32, batch 1 and 3
with mixed prompt lengths, W = 1 and W > 1, with and without an EOS hit), on a 4-bit quantized copy,
and on SmolLM2-135M-Instruct; the K/V a tree forward writes equal mlx-lm's plain causal pass over the
accepted path; sampling keeps the target's distribution (the chi-square harness of test_sampling.py);
bad folders, models and caches raise errors naming what is wrong.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from helpers import random_drafter, random_target  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache  # noqa: E402
from mlx_lm.sample_utils import make_sampler  # noqa: E402
from mlx_lm.utils import load_model  # noqa: E402
from test_mlx_decode import forbid_host_reads  # noqa: E402, F401  (the fixture, shared)

import redrafter_ext as rx  # noqa: E402
import redrafter_ext.mlx as rxm  # noqa: E402
from redrafter_ext.demo import CHECKPOINTS, load_prompt_ids  # noqa: E402
from redrafter_ext.mlx import reference as mref  # noqa: E402
from redrafter_ext.mlx.adapters.mlx_lm import MLXLMTarget, TokenRoPE, supported_model_types  # noqa: E402

DOCS = Path(__file__).resolve().parents[1] / "docs" / "mlx.md"


def mlx_lm_greedy(model, prompt: list[int], max_new: int, eos: int | None = None) -> list[int]:
    """mlx-lm's own greedy generation at batch 1: ``generate_step`` with its argmax sampler, new
    tokens only. Stops after ``eos``, keeping it (our ``generate``'s rule; ``stream_generate``
    drops the EOS from what it yields)."""
    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_new, sampler=make_sampler(0.0)):
        out.append(int(tok))
        if out[-1] == eos:
            break
    return out


_REFERENCE: dict = {}


def mlx_lm_outputs(model, prompts: list[list[int]], max_new: int, eos: int | None = None) -> list[list[int]]:
    """``mlx_lm_greedy`` of each prompt alone, memoized per model (tests share the shipped model's)."""
    keys = [(id(model), tuple(p), max_new, eos) for p in prompts]
    for k, p in zip(keys, prompts):
        if k not in _REFERENCE:
            _REFERENCE[k] = mlx_lm_greedy(model, p, max_new, eos)
    return [_REFERENCE[k] for k in keys]


def to_np(a) -> np.ndarray:
    return np.array(a.astype(mx.float32))


@pytest.fixture(scope="module")
def shipped():
    from tokenizers import Tokenizer

    target = MLXLMTarget.from_pretrained(CHECKPOINTS / "target")  # float32
    drafter = rxm.Drafter.from_pretrained(CHECKPOINTS / "drafter", dtype=mx.float32)
    tok = Tokenizer.from_file(str(CHECKPOINTS / "target" / "tokenizer.json"))
    p = load_prompt_ids(tok, 3, 160, target.vocab_size)  # held-out files
    prompts = [p[0][:23], p[1], p[2][:41]]  # mixed lengths
    assert len({len(x) for x in prompts}) == 3
    return target, drafter, prompts


# ------------------------------------------------------------------------------------------------
# greedy equality with mlx-lm's own generation


def test_from_pretrained_loads_the_shipped_model(shipped):
    target, _, _ = shipped
    assert type(target.model).__module__ == "mlx_lm.models.llama"
    assert target.dtype == mx.float32 and target.embed_weight.dtype == mx.float32  # checkpoint bf16, cast
    assert (target.vocab_size, target.hidden_size, target.eos_token_id) == (4096, 384, 0)
    assert target.tokenizer is not None
    assert all(isinstance(layer.self_attn.rope, TokenRoPE) for layer in target.model.layers)
    kv = target.new_kv_cache(2, 10)
    assert kv.shape == (6, 2, 2, 2, 10, 64) and kv.dtype == mx.float32


@pytest.mark.parametrize("rows,W,L", [((0,), 1, 8), ((0, 1, 2), 1, 8), ((0, 1, 2), 2, 5), ((1,), 3, 4)])
def test_generate_equals_mlx_lm_greedy(shipped, rows, W, L):
    target, drafter, prompts = shipped
    prompts = [prompts[r] for r in rows]
    max_new, eos = 40, target.eos_token_id
    want = mlx_lm_outputs(target.model, prompts, max_new, eos)  # each prompt alone
    out = rxm.generate(target, drafter, prompts, max_new, beam_width=W, beam_length=L, eos_id=eos)
    assert out.tokens == want
    assert out.tokens_per_step > 1.5  # the drafter is accepted through the adapter too
    assert rxm.autoregressive_generate(target, prompts, max_new, eos_id=eos).tokens == want


def test_generate_equals_mlx_lm_greedy_with_eos_hit(shipped):
    """An EOS that rows hit at different steps (a token taken from mlx-lm's own output)."""
    target, drafter, prompts = shipped
    free = mlx_lm_outputs(target.model, prompts, 40)
    eos = free[1][12]
    want = mlx_lm_outputs(target.model, prompts, 40, eos)
    assert len(want[1]) <= 13 and want[1][-1] == eos
    assert any(len(w) == 40 for w in want) or len({len(w) for w in want}) > 1  # rows stop at different steps
    for W, L in [(1, 8), (2, 4)]:
        out = rxm.generate(target, drafter, prompts, 40, beam_width=W, beam_length=L, eos_id=eos, check_every=3)
        assert out.tokens == want, (W, L)
        assert out.calls - max(out.steps) < 3


def test_policy_greedy_equals_mlx_lm(shipped):
    # the speculation policy switches (W, L) over one cache: still mlx-lm's greedy output
    target, drafter, prompts = shipped
    want = mlx_lm_outputs(target.model, prompts, 40, target.eos_token_id)
    out = rxm.generate(target, drafter, prompts, 40, beam_width="auto", beam_length="auto", eos_id=target.eos_token_id)
    assert out.tokens == want


def test_quantized_model_equals_mlx_lm_greedy(shipped):
    """A 4-bit mlx-lm model (what mlx-community checkpoints are): the embedding table is dequantized
    once for the drafter; output still mlx-lm's own greedy output on the same quantized model."""
    _, drafter, prompts = shipped
    model, _ = load_model(CHECKPOINTS / "target")
    model.set_dtype(mx.float32)
    nn.quantize(model, group_size=64, bits=4)
    target = MLXLMTarget(model)
    assert isinstance(model.model.embed_tokens, nn.QuantizedEmbedding)
    assert target.embed_weight.shape == (4096, 384) and target.embed_weight.dtype == mx.float32
    want = [mlx_lm_greedy(model, p, 24) for p in prompts]
    out = rxm.generate(target, drafter, prompts, 24, beam_width=2, beam_length=5)
    assert out.tokens == want
    assert out.tokens_per_step > 1.5


# ------------------------------------------------------------------------------------------------
# what a forward writes


def _random_trie(V: int, B: int, W: int, L: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    beams = torch.randint(0, V, (B, W, L), generator=g)
    beams[:, 1:, :2] = beams[:, :1, :2]  # shared prefixes: a real trie, not W chains
    beams = mx.array(beams.numpy().astype(np.int32))
    tok, par, dep, beam_node, nn_ = mref.build_trie(beams)
    return beams, tok, dep, beam_node, mref.tree_mask(par, nn_)


def test_tree_kv_equals_causal_pass_over_accepted_path(shipped):
    """Tree forward + kv_compact along a chosen path leave exactly the K/V (and give the logits and
    hidden states) of mlx-lm's plain causal pass (its own KVCache) over prompt + path."""
    target, _, _ = shipped
    model = target.model
    B, W, L, S = 3, 3, 4, 48
    prompts = [[5, 17, 300, 41, 9], [7, 7, 1000, 12, 3, 99, 410, 8, 8], [64, 2]]
    lengths = mx.array([len(p) for p in prompts], dtype=mx.int32)
    T0 = max(len(p) for p in prompts)
    padded = mx.array([p + [0] * (T0 - len(p)) for p in prompts], dtype=mx.int32)
    _, _, kv = target.prefill(padded, lengths, target.new_kv_cache(B, S))
    beams, tok, dep, beam_node, mask = _random_trie(target.vocab_size, B, W, L, seed=0)
    logits, hidden, kv_tree = target(tok, lengths[:, None] + dep, mask, lengths, kv)
    best, accept = [2, 0, 1], [3, 1, 2]  # per row: the beam taken and how deep (beam 2 branches off at depth 2)
    path = np.full((B, L), -1, dtype=np.int32)
    bn = np.array(beam_node)
    for b in range(B):
        path[b, : accept[b] + 1] = bn[b, best[b], : accept[b] + 1]
    kv_new, cache_len = mref.kv_compact(kv_tree, lengths, mx.array(path), mx.array(accept, dtype=mx.int32))
    assert cache_len.tolist() == [len(p) + a + 1 for p, a in zip(prompts, accept)]
    beams_np = np.array(beams)
    for b in range(B):
        seq = prompts[b] + beams_np[b, best[b], : accept[b] + 1].tolist()
        cache = make_prompt_cache(model)
        causal_logits = model(mx.array([seq]), cache=cache).astype(mx.float32)
        causal_hidden = model.model(mx.array([seq]), cache=make_prompt_cache(model))
        n = len(seq)
        for i, c in enumerate(cache):
            np.testing.assert_allclose(to_np(kv_new[i, 0, b, :, :n]), to_np(c.keys[0, :, :n]), atol=1e-4, rtol=1e-4)
            np.testing.assert_allclose(to_np(kv_new[i, 1, b, :, :n]), to_np(c.values[0, :, :n]), atol=1e-4, rtol=1e-4)
        nodes = path[b, : accept[b] + 1]
        P = len(prompts[b])
        np.testing.assert_allclose(to_np(logits[b][mx.array(nodes)]), to_np(causal_logits[0, P:]), atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(to_np(hidden[b][mx.array(nodes)]), to_np(causal_hidden[0, P:]), atol=1e-4, rtol=1e-4)


def test_tree_forward_writes_only_its_slots_and_matches_llama_target(shipped):
    target, _, _ = shipped
    ours = rxm.LlamaTarget.from_pretrained(CHECKPOINTS / "target")
    B, W, L, S = 3, 2, 4, 40
    _, tok, dep, _, mask = _random_trie(target.vocab_size, B, W, L, seed=1)
    T = tok.shape[1]
    cache_len = mx.array([5, 0, S - T], dtype=mx.int32)  # the last row fills the cache exactly
    kv0 = mx.random.normal(target.new_kv_cache(B, S).shape, key=mx.random.key(0))
    got_l, got_h, got_kv = target(tok, cache_len[:, None] + dep, mask, cache_len, kv0)
    want_l, want_h, want_kv = ours(tok, cache_len[:, None] + dep, mask, cache_len, kv0)
    assert got_l.dtype == mx.float32 and got_l.shape == (B, T, target.vocab_size) and got_h.shape == (B, T, 384)
    np.testing.assert_allclose(to_np(got_l), to_np(want_l), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(to_np(got_h), to_np(want_h), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(to_np(got_kv), to_np(want_kv), atol=1e-5, rtol=1e-5)
    g, k0 = np.array(got_kv), np.array(kv0)
    for b, c in enumerate(cache_len.tolist()):
        keep = np.ones(S, dtype=bool)
        keep[c : c + T] = False
        assert np.array_equal(g[:, :, b][:, :, :, keep], k0[:, :, b][:, :, :, keep])  # bytewise intact
        assert not np.array_equal(g[:, :, b, :, c : c + T], k0[:, :, b, :, c : c + T])


def test_decode_steps_leave_the_causal_cache(shipped):
    """After real decode steps (drafter, verify, compaction) each row's committed K/V are those of
    mlx-lm's causal pass over prompt + committed tokens."""
    target, drafter, prompts = shipped
    state = rxm.decode._start(target, prompts, 16, 9, None, None, None, 0)
    for _ in range(3):
        state, _ = rxm.decode_step(target, drafter, state, beam_width=2, beam_length=5)
    n_out, cache_len, out = state.num_out.tolist(), state.cache_len.tolist(), state.out.tolist()
    for b, p in enumerate(prompts):
        seq = p + out[b][: n_out[b]]
        assert cache_len[b] == len(seq) and n_out[b] >= 3
        cache = make_prompt_cache(target.model)
        mx.eval(target.model(mx.array([seq]), cache=cache))
        for i, c in enumerate(cache):
            np.testing.assert_allclose(to_np(state.kv[i, 0, b, :, : len(seq)]), to_np(c.keys[0, :, : len(seq)]),
                                       atol=1e-4, rtol=1e-4)


def test_wrapped_rope_leaves_mlx_lm_unchanged():
    """MLXLMTarget wraps each layer's rope in place: mlx-lm's own caches give bit-identical logits
    after it, and a second adapter over the same model does not wrap twice."""
    model, _ = load_model(CHECKPOINTS / "target")
    model.set_dtype(mx.float32)
    seq = mx.array([[5, 17, 300, 41, 9, 2, 64]])

    def run():
        cache = make_prompt_cache(model)
        a = model(seq, cache=cache)
        b = model(mx.array([[11]]), cache=cache)  # one decode step at an int offset
        mx.eval(a, b)
        return np.array(a), np.array(b)

    before = run()
    MLXLMTarget(model)
    MLXLMTarget(model)
    assert all(isinstance(layer.self_attn.rope, TokenRoPE) and not isinstance(layer.self_attn.rope.inner, TokenRoPE)
               for layer in model.layers)
    after = run()
    assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])


def test_rope_parameters_are_carried_over(tmp_path):
    """A transformers-5 config keeps rope_theta inside rope_parameters, where mlx-lm 0.32 does not
    look; from_pretrained carries it over, so the model equals the torch LlamaTarget's."""
    random_target(vocab=97, hidden=64, layers=2, seed=3).save_pretrained(tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_theta": 1e5, "rope_type": "default"}
    (tmp_path / "t" / "config.json").write_text(json.dumps(cfg))
    for f in ("tokenizer.json", "tokenizer_config.json"):  # mlx_lm.load needs a tokenizer to load
        shutil.copy(CHECKPOINTS / "target" / f, tmp_path / "t" / f)
    tgt = rx.LlamaTarget.from_pretrained(tmp_path / "t", dtype=torch.float32)  # reads rope_parameters
    target = MLXLMTarget.from_pretrained(tmp_path / "t")
    assert tgt.config.rope_theta == target.config.rope_theta == 1e5
    tokens = torch.tensor([[5, 17, 30, 41, 9, 2, 64, 90]])
    with torch.no_grad():
        want, _ = tgt.prefill(tokens, torch.tensor([8], dtype=torch.int32), tgt.new_kv_cache(1, 8))
    got, _, _ = target.prefill(mx.array(tokens.numpy()), mx.array([8], dtype=mx.int32), target.new_kv_cache(1, 8))
    np.testing.assert_allclose(to_np(got), want.numpy(), atol=1e-4, rtol=1e-4)


def test_decode_step_does_no_host_reads(shipped, forbid_host_reads, monkeypatch):  # noqa: F811
    target, drafter, prompts = shipped
    state = rxm.decode._start(target, prompts, 8, 9, None, None, rxm.SamplingParams(1.0, 5, 0.9), 0)
    forbid_host_reads()
    with pytest.raises(RuntimeError, match="host read"):  # negative control: the guard works
        rxm.decode._progress(state)
    for sampling in (None, rxm.SamplingParams(1.0, 5, 0.9)):
        for _ in range(2):
            state, n = rxm.decode_step(target, drafter, state, beam_width=2, beam_length=4, ops=mref,
                                       sampling=sampling)
            mx.eval(state.arrays(), n)
    monkeypatch.undo()
    assert min(state.num_out.tolist()) >= 4


# ------------------------------------------------------------------------------------------------
# sampling: the target's distribution through the adapter


def test_sampling_first_tokens_follow_target(tmp_path):
    # the end-to-end chi-square of test_mlx_decode.py, with the mlx-lm model as the target
    import test_sampling as ts

    Vs, B, n, temperature, top_k, top_p = 11, 6_000, 3, 1.0, 8, 0.95
    tgt = random_target(vocab=Vs, hidden=32, layers=1, seed=3)
    tgt.save_pretrained(tmp_path / "t")
    random_drafter(tgt).save_pretrained(tmp_path / "d")
    model, _ = load_model(tmp_path / "t")  # no tokenizer in this folder: mlx-lm's model loader alone
    target = MLXLMTarget(model)
    drafter = rxm.Drafter.from_pretrained(tmp_path / "d", dtype=mx.float32)
    prompt = [1, 4, 2, 7]
    truth = ts.joint_first_tokens(tgt, prompt, n, temperature, top_k, top_p)
    out = rxm.generate(target, drafter, [prompt] * B, n, beam_width=3, beam_length=3, ops=mref,
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=13)
    assert out.tokens_per_step > 1.05  # speculation really commits several tokens per step
    x = torch.tensor(out.tokens)
    code = (x[:, 0] * Vs + x[:, 1]) * Vs + x[:, 2]
    stat, dof, pval = ts.chi_square(torch.bincount(code, minlength=Vs**n).double(), truth * B)
    print(f"mlx-lm adapter: chi2={stat:.1f} dof={dof} p={pval:.3g} tokens/step={out.tokens_per_step:.2f}")
    assert pval > 0.01
    # the harness's power with this target: a wrong acceptance rule is seen (p ~ 0)
    from test_mlx_decode import _biased_ops

    bad = rxm.generate(target, drafter, [prompt] * B, n, beam_width=3, beam_length=3, ops=_biased_ops(),
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=13)
    x = torch.tensor(bad.tokens)
    code = (x[:, 0] * Vs + x[:, 1]) * Vs + x[:, 2]
    assert ts.chi_square(torch.bincount(code, minlength=Vs**n).double(), truth * B)[2] < 1e-6


# ------------------------------------------------------------------------------------------------
# bad input


def test_bad_folders_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist; give a local model folder"):
        MLXLMTarget.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="has no config.json: not an mlx-lm model folder"):
        MLXLMTarget.from_pretrained(CHECKPOINTS / "drafter")  # a drafter folder, not a model
    (tmp_path / "q").mkdir()
    (tmp_path / "q" / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    with pytest.raises(ValueError, match=r"model_type 'qwen2'; MLXLMTarget supports mlx-lm's Llama architecture, "
                                         r"model_type in \('llama', .*'mistral'"):
        MLXLMTarget.from_pretrained(tmp_path / "q")
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        MLXLMTarget.from_pretrained(tmp_path / "j")
    (tmp_path / "w").mkdir()
    shutil.copy(CHECKPOINTS / "target" / "config.json", tmp_path / "w" / "config.json")
    with pytest.raises(FileNotFoundError, match=r"has no model\*.safetensors weights"):
        MLXLMTarget.from_pretrained(tmp_path / "w")
    assert "llama" in supported_model_types() and "mistral" in supported_model_types()


def test_other_architectures_are_rejected():
    from mlx_lm.models import llama, qwen2

    args = dict(hidden_size=32, num_hidden_layers=2, intermediate_size=64, num_attention_heads=4, rms_norm_eps=1e-5,
                vocab_size=50, num_key_value_heads=2)
    qwen = qwen2.Model(qwen2.ModelArgs(model_type="qwen2", **args))
    with pytest.raises(ValueError, match=r"supports mlx-lm's Llama models .*got mlx_lm.models.qwen2.Model "
                                         r"\(model_type 'qwen2'\)"):
        MLXLMTarget(qwen)
    swa = llama.Model(llama.ModelArgs(model_type="llama", layer_types=["full_attention", "sliding_attention"],
                                      sliding_window=8, **args))
    with pytest.raises(ValueError, match=r"layers \[1\] use sliding-window attention"):
        MLXLMTarget(swa)


def test_bad_caches_and_arrays_raise(shipped):
    target, drafter, _ = shipped
    one = mx.zeros((1, 3), dtype=mx.int32)
    tree, cl = rxm.causal_tree_mask(1, 3), mx.zeros((1,), dtype=mx.int32)
    with pytest.raises(ValueError, match=r"kv has S = 2 cache slots, fewer than the T = 3 tokens"):
        target.prefill(one, mx.array([3], dtype=mx.int32), target.new_kv_cache(1, 2))  # a cache too small
    with pytest.raises(ValueError, match=r"kv must have shape \(n_layers, 2, B, H_kv, S, D\) = \(6, 2, 1, 2, 8, 64\)"):
        target(one, one, tree, cl, target.new_kv_cache(2, 8))
    with pytest.raises(TypeError, match="kv dtype mlx.core.bfloat16 must equal the model dtype mlx.core.float32"):
        target(one, one, tree, cl, target.new_kv_cache(1, 8, dtype=mx.bfloat16))
    with pytest.raises(TypeError, match="tree_mask must have dtype in"):
        target(one, one, tree.astype(mx.int32), cl, target.new_kv_cache(1, 8))
    with pytest.raises(ValueError, match=r"positions must have shape \(1, 3\)"):
        target(one, mx.zeros((1, 2), dtype=mx.int32), tree, cl, target.new_kv_cache(1, 8))
    with pytest.raises(ValueError, match=r"generate: max_len=12 leaves no room"):
        rxm.generate(target, drafter, [[1, 2, 3, 4]], 8, beam_width=2, beam_length=3, max_len=12)


def test_cache_overflow_stops_and_flags_the_row(shipped):
    # S = 12, W=2 L=3 -> N = 5: row 1 (cache_len 8) lacks room and is stopped, row 0 steps
    target, drafter, _ = shipped
    state = rxm.decode._start(target, [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11]], 4, 4, None, None, None, 0)
    state = dataclasses.replace(state, kv=state.kv[:, :, :, :, :12])
    new, n = rxm.decode_step(target, drafter, state, beam_width=2, beam_length=3)
    assert new.overflow.tolist() == [False, True] and n.tolist()[1] == 0 and n.tolist()[0] >= 1
    np.testing.assert_array_equal(np.array(new.kv[:, :, 1, :, :8]), np.array(state.kv[:, :, 1, :, :8]))
    with pytest.raises(ValueError, match=r"cache overflow in row 1: cache_len = 8 leaves room for 4 of the S = 12"):
        new.check_overflow()


# ------------------------------------------------------------------------------------------------
# docs and packaging


def test_docs_example_runs():
    """The mlx-lm example of docs/mlx.md, executed as written."""
    m = re.search(r"<!-- example: mlx-lm -->\s*```python\n(.*?)```", DOCS.read_text(), re.S)
    assert m, "docs/mlx.md lacks the tested mlx-lm example"
    ns: dict = {}
    exec(compile(m.group(1), str(DOCS), "exec"), ns)  # noqa: S102  (our own documentation)
    assert ns["out"].tokens == [mlx_lm_greedy(ns["target"].model, p, 32, ns["eos"]) for p in ns["prompts"]]


def test_adapter_reachable_lazily():
    # `rxm.adapters.mlx_lm.MLXLMTarget` after a plain `import redrafter_ext.mlx`; mlx-lm loads only then
    code = ("import sys, redrafter_ext.mlx as rxm; assert 'mlx_lm' not in sys.modules; "
            "print(rxm.adapters.mlx_lm.MLXLMTarget.__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "MLXLMTarget", r.stderr[-2000:]


# ------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (converted once by redrafter_ext.hub; ~30 s on 2 shared cores)


def test_smollm2_equals_mlx_lm_greedy_on_heldout():
    from redrafter_ext.hub import drafter_folder, load_tokenizer, model_folder
    from redrafter_ext.train.chat_data import chat_prompt_ids
    from redrafter_ext.train.prompts import heldout_prompts

    folder = model_folder("smollm2-135m-instruct")
    target = MLXLMTarget.from_pretrained(folder)
    assert target.config.rope_theta == 1e5 and target.eos_token_id == 2  # rope_parameters carried over
    drafter = rxm.Drafter.from_pretrained(drafter_folder("smollm2-135m-instruct"), dtype=mx.float32)
    tok = load_tokenizer(folder)
    prompts = [chat_prompt_ids(tok, p) for p in heldout_prompts(3)]
    prompts[2] = prompts[2][:30] + prompts[2][-5:]  # mixed lengths
    n = 12
    want = [mlx_lm_greedy(target.model, p, n, 2) for p in prompts]
    out = rxm.generate(target, drafter, prompts, n, beam_width=1, beam_length=4, eos_id=2)
    assert out.tokens == want
    out = rxm.generate(target, drafter, prompts[:1], n, beam_width=2, beam_length=4, eos_id=2)
    assert out.tokens == want[:1]
    assert out.tokens_per_step > 1.2
