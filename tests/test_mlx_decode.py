"""The MLX decode loop: models against their torch twins, greedy equality with plain decoding (and
with the torch backend) on the shipped model, EOS and mixed prompt lengths, sampling, no host reads,
the prompt-lookup beam (``lookup=``, as in tests/test_lookup_decode.py for the torch loop)."""

from __future__ import annotations

import dataclasses

import pytest

mx = pytest.importorskip("mlx.core")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from helpers import BAD_BEAM_SHAPES, BAD_GENERATE_ARGS, random_drafter, random_target  # noqa: E402

import redrafter_ext as rx  # noqa: E402
import redrafter_ext.mlx as rxm  # noqa: E402
from redrafter_ext.demo import CHECKPOINTS, load_prompt_ids  # noqa: E402
from redrafter_ext.mlx import reference as mref  # noqa: E402
from redrafter_ext.policy import SpeculationPolicy  # noqa: E402

SHIPPED_NEW_TOKENS = 24


def to_np(a) -> np.ndarray:
    return np.array(a.astype(mx.float32) if a.dtype == mx.bfloat16 else a)


# ------------------------------------------------------------------------------------------------
# models


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A small random torch target + drafter and their MLX twins (loaded from saved checkpoints)."""
    folder = tmp_path_factory.mktemp("tiny")
    target = random_target(vocab=97, hidden=64, layers=2, seed=3)
    drafter = random_drafter(target, seed=1, layers=1)
    target.save_pretrained(folder / "target")
    drafter.save_pretrained(folder / "drafter")
    mt = rxm.LlamaTarget.from_pretrained(folder / "target")
    md = rxm.Drafter.from_pretrained(folder / "drafter", dtype=mx.float32)
    return target, drafter, mt, md


@pytest.fixture(scope="module")
def shipped():
    from tokenizers import Tokenizer

    tt = rx.LlamaTarget.from_pretrained(CHECKPOINTS / "target", dtype=torch.float32)
    td = rx.Drafter.from_pretrained(CHECKPOINTS / "drafter")
    mt = rxm.LlamaTarget.from_pretrained(CHECKPOINTS / "target")
    md = rxm.Drafter.from_pretrained(CHECKPOINTS / "drafter")
    tok = Tokenizer.from_file(str(CHECKPOINTS / "target" / "tokenizer.json"))
    prompts = load_prompt_ids(tok, 3, 160, tt.vocab_size)  # held-out files, different lengths
    return tt, td, mt, md, prompts


def test_tree_forward_matches_torch(tiny):
    target, _, mt, _ = tiny
    g = torch.Generator().manual_seed(0)
    B, P, W, L, S = 3, 6, 3, 3, 24
    V = target.vocab_size
    prompts = torch.randint(0, V, (B, P), generator=g)
    lengths = torch.tensor([6, 3, 5], dtype=torch.int32)
    kv = target.new_kv_cache(B, S)
    with torch.no_grad():
        want_l, want_h = target.prefill(prompts, lengths, kv)
    mkv = mt.new_kv_cache(B, S)
    got_l, got_h, mkv = mt.prefill(mx.array(prompts.numpy()), mx.array(lengths.numpy()), mkv)
    np.testing.assert_allclose(to_np(got_l), want_l.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(to_np(got_h), want_h.numpy(), atol=1e-4, rtol=1e-4)

    beams = torch.randint(0, 3, (B, W, L), generator=g)
    beams[:, :, 0] = beams[:, :1, 0]
    tok, par, dep, _, nn = rx.reference.build_trie(beams)
    mask = rx.reference.tree_mask(par, nn)
    pos = lengths[:, None] + dep
    with torch.no_grad():
        want_l, want_h = target(tok, pos, mask, lengths, kv)
    got_l, got_h, mkv = mt(mx.array(tok.numpy()), mx.array(pos.numpy()), mx.array(mask.numpy()),
                           mx.array(lengths.numpy()), mkv)
    np.testing.assert_allclose(to_np(got_l), want_l.numpy(), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(to_np(got_h), want_h.numpy(), atol=1e-4, rtol=1e-4)
    # the caches agree on every slot either side wrote (prompt + tree; the rest is zero on both)
    np.testing.assert_allclose(to_np(mkv), kv.numpy(), atol=1e-4, rtol=1e-4)


def test_shipped_drafter_beams_match_torch(shipped):
    tt, _, mt, _, _ = shipped
    td = rx.Drafter.from_pretrained(CHECKPOINTS / "drafter", dtype=torch.float32)
    md = rxm.Drafter.from_pretrained(CHECKPOINTS / "drafter", dtype=mx.float32)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, tt.hidden_size, generator=g)
    token = torch.tensor([5, 17, 300])
    for W, L in [(4, 4), (1, 5), (3, 1)]:
        want = td.beam_search(hidden, token, tt.embed_weight, W, L, rx.reference)
        got = md.beam_search(mx.array(hidden.numpy()), mx.array(token.numpy()), mt.embed_weight, W, L, mref)
        assert np.array_equal(np.array(got), want.numpy()), (W, L)


# ------------------------------------------------------------------------------------------------
# greedy equality


@pytest.mark.parametrize("B,W,L,lookup", [(1, 2, 4, 0), (3, 2, 3, 0), (3, 2, 3, 2)])
def test_shipped_greedy_equals_ar_and_torch(shipped, B, W, L, lookup):
    tt, td, mt, md, prompts = shipped
    prompts = prompts[:B]
    eos = tt.config.eos_token_id
    n = SHIPPED_NEW_TOKENS
    got = rxm.generate(mt, md, prompts, n, beam_width=W, beam_length=L, eos_id=eos, lookup=lookup)
    ar = rxm.autoregressive_generate(mt, prompts, n, eos_id=eos)
    torch_out = rx.generate(tt, td, prompts, n, beam_width=W, beam_length=L, eos_id=eos, ops=rx.reference,
                            lookup=lookup)
    assert got.tokens == ar.tokens
    assert got.tokens == torch_out.tokens
    assert all(len(t) == n for t in got.tokens)
    assert got.tokens_per_step > 1.2  # the trained drafter is accepted well beyond chance


def test_eos_and_mixed_prompt_lengths(tiny):
    target, drafter, mt, md = tiny
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15], [40, 41]]
    n = 20
    free = rxm.autoregressive_generate(mt, prompts, n)
    eos = free.tokens[1][6]  # a token row 1 emits mid-way: that row (and maybe others) stops there
    ar = rxm.autoregressive_generate(mt, prompts, n, eos_id=eos)
    assert len(ar.tokens[1]) <= 7 and ar.tokens[1][-1] == eos
    for W, L, lookup in [(2, 3, 0), (3, 4, 0), (1, 1, 0), (2, 3, 2), (1, 1, 2)]:
        got = rxm.generate(mt, md, prompts, n, beam_width=W, beam_length=L, eos_id=eos, check_every=3, lookup=lookup)
        assert got.tokens == ar.tokens, (W, L, lookup)
        want = rx.generate(target, drafter, prompts, n, beam_width=W, beam_length=L, eos_id=eos, ops=rx.reference,
                           lookup=lookup)
        assert got.tokens == want.tokens, (W, L, lookup)
    assert rxm.generate(mt, md, prompts, 0).tokens == [[], [], []]
    # without EOS no step runs after the last row finished; with it, fewer than check_every
    for W, L in [(2, 3), (1, 1)]:
        got = rxm.generate(mt, md, prompts, n, beam_width=W, beam_length=L)
        assert got.calls == max(got.steps), (W, L, got.calls, got.steps)
        got = rxm.generate(mt, md, prompts, n, beam_width=W, beam_length=L, eos_id=eos, check_every=3)
        assert 0 <= got.calls - max(got.steps) < 3, (W, L, got.calls, got.steps)
    assert rxm.autoregressive_generate(mt, prompts, n).calls == n


def test_check_every_default_and_bad_values(tiny):
    # the torch loop's argument (tests/test_decode.py); MLX passes no device: None reads every 4 steps
    _, _, mt, md = tiny
    prompts = [[7, 8, 9, 10, 11, 12, 13, 14, 15]]
    eos = rxm.autoregressive_generate(mt, prompts, 20).tokens[0][9]  # the row stops at EOS mid-way
    for kw in ({}, {"check_every": None}):
        ar = rxm.autoregressive_generate(mt, prompts, 20, eos_id=eos, **kw)
        assert ar.calls == -(-max(ar.steps) // 4) * 4, (kw, ar.calls, ar.steps)  # read after steps 4, 8, ...
        got = rxm.generate(mt, md, prompts, 20, beam_width=2, beam_length=3, eos_id=eos, **kw)
        want = rxm.generate(mt, md, prompts, 20, beam_width=2, beam_length=3, eos_id=eos, check_every=4)
        assert (got.tokens, got.calls) == (want.tokens, want.calls), kw
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="generate: check_every must be an int >= 1"):
            rxm.generate(mt, md, prompts, 4, check_every=bad)
        with pytest.raises(ValueError, match="generate: check_every must be an int >= 1"):
            rxm.autoregressive_generate(mt, prompts, 4, check_every=bad)


class _Scripted(SpeculationPolicy):
    """Switches (W, L) along a fixed script, ignoring the measurements."""

    def __init__(self, script, menu):
        super().__init__(menu=menu)
        self.script, self.i = list(script), 0

    def choose(self, rows, context=None, batch=None):
        self.i += 1
        return self.script[(self.i - 1) % len(self.script)]


def test_policy_greedy_equals_ar_under_switches(tiny):
    # the MLX loop under a speculation policy: one cache for every shape, greedy output unchanged
    _, _, mt, md = tiny
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9, 10, 11, 12, 13, 14, 15], [40, 41]]
    n = 24
    eos = rxm.autoregressive_generate(mt, prompts, n).tokens[1][9]
    ar = rxm.autoregressive_generate(mt, prompts, n, eos_id=eos)
    script = [((1, 1), 2), ((2, 3), 1), ((1, 5), 3), ((3, 4), 2)]
    got = rxm.generate(mt, md, prompts, n, eos_id=eos, policy=_Scripted(script, tuple(e for e, _ in script)))
    assert got.tokens == ar.tokens
    policy = SpeculationPolicy(menu=((1, 1), (2, 3), (1, 5)))
    for _ in range(2):  # a policy kept across calls, as an engine keeps one
        assert rxm.generate(mt, md, prompts, n, eos_id=eos, policy=policy).tokens == ar.tokens
    assert {e for (_, e, _) in policy.seconds_per_step} == set(policy.menu)  # every entry was measured
    assert rxm.generate(mt, md, prompts, n, eos_id=eos, beam_width="auto", beam_length="auto").tokens == ar.tokens
    with pytest.raises(ValueError, match="'auto' together"):
        rxm.generate(mt, md, prompts, 4, beam_width="auto", beam_length=3)
    with pytest.raises(TypeError, match="SpeculationPolicy"):
        rxm.generate(mt, md, prompts, 4, policy=object())


# ------------------------------------------------------------------------------------------------
# sampling


def test_low_temperature_is_greedy(tiny):
    _, _, mt, md = tiny
    prompts = [[1, 2, 3], [50, 60, 70, 80]]
    greedy = rxm.autoregressive_generate(mt, prompts, 16)
    # a vanishing temperature, or top-k / top-p that keep only the argmax, are greedy decoding
    for kw in ({"temperature": 1e-4}, {"temperature": 1e-4, "top_k": 3, "top_p": 0.5},
               {"temperature": 1.0, "top_k": 1}, {"temperature": 2.0, "top_p": 1e-9}):
        assert rxm.generate(mt, md, prompts, 16, beam_width=2, beam_length=3, seed=5, **kw).tokens == greedy.tokens
        assert rxm.autoregressive_generate(mt, prompts, 16, seed=5, **kw).tokens == greedy.tokens


def test_sampling_reproducible_with_a_seed(tiny):
    _, _, mt, md = tiny
    prompts = [[1, 2, 3], [50, 60, 70, 80]]
    kw = dict(beam_width=2, beam_length=3, temperature=1.0, top_k=20)
    a = rxm.generate(mt, md, prompts, 16, seed=7, **kw)
    b = rxm.generate(mt, md, prompts, 16, seed=7, **kw)
    assert a.tokens == b.tokens
    others = [rxm.generate(mt, md, prompts, 16, seed=s, **kw).tokens for s in (8, 9)]
    assert any(o != a.tokens for o in others)  # the seed matters
    c = rxm.autoregressive_generate(mt, prompts, 16, seed=7, temperature=1.0, top_k=20)
    assert c.tokens == rxm.autoregressive_generate(mt, prompts, 16, seed=7, temperature=1.0, top_k=20).tokens
    with pytest.raises(ValueError, match="temperature"):
        rxm.generate(mt, md, prompts, 4, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        rxm.generate(mt, md, prompts, 4, temperature=1.0, top_p=0.0)


def test_decode_step_with_explicit_uniforms_matches_verify_sample(tiny):
    _, _, mt, md = tiny
    state = rxm.decode._start(mt, [[1, 2, 3], [4, 5]], 8, 7, None, None, None, 0)
    sampling = rxm.SamplingParams(0.8, 0, 0.9)
    u = (mx.random.uniform(shape=(2, 2, 3), key=mx.random.key(1)), mx.random.uniform(shape=(2,), key=mx.random.key(2)))
    a, na = rxm.decode_step(mt, md, state, beam_width=3, beam_length=3, ops=mref, sampling=sampling, uniforms=u)
    b, nb = rxm.decode_step(mt, md, state, beam_width=3, beam_length=3, ops=mref, sampling=sampling, uniforms=u)
    assert np.array_equal(np.array(a.out), np.array(b.out)) and np.array_equal(np.array(na), np.array(nb))
    with pytest.raises(ValueError, match="uniforms"):
        rxm.decode_step(mt, md, state, beam_width=3, beam_length=3, ops=mref, uniforms=u)


# ------------------------------------------------------------------------------------------------
# no host reads inside decode_step


HOST_READS = ("item", "tolist", "__array__", "__bool__", "__int__", "__float__", "__index__")


@pytest.fixture
def forbid_host_reads(monkeypatch):
    """Make every Python-level way of reading an mx.array's values raise. numpy reaches the data
    through the C buffer protocol, which cannot be patched: np.array/np.asarray are wrapped instead."""

    def arm():
        for name in HOST_READS:
            def boom(self, *a, _name=name, **k):
                raise RuntimeError(f"host read: mx.array.{_name}")

            monkeypatch.setattr(mx.array, name, boom)
        for name in ("array", "asarray"):
            orig = getattr(np, name)

            def guarded(obj, *a, _orig=orig, _name=name, **k):
                if isinstance(obj, mx.array):
                    raise RuntimeError(f"host read: np.{_name}(mx.array)")
                return _orig(obj, *a, **k)

            monkeypatch.setattr(np, name, guarded)

    return arm


# the reference ops, and the native ones when their extension is built
OPS = [mref] + [m for m in [rxm.native_ops()] if m is not None]


@pytest.mark.parametrize("ops", OPS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
@pytest.mark.parametrize("sampling", [None, rxm.SamplingParams(1.0, 5, 0.9)])
@pytest.mark.parametrize("lookup", [0, 2])
def test_decode_step_does_no_host_reads(tiny, forbid_host_reads, monkeypatch, sampling, ops, lookup):
    _, _, mt, md = tiny
    # slack 9 >= the trie, 1 + 3*2 (the lookup beam adds no node)
    state = rxm.decode._start(mt, [[1, 2, 3], [4, 5, 6, 7, 8]], 8, 9, 3, None, sampling, 0, history=lookup > 0)
    forbid_host_reads()
    # negative control: the guard catches a host read
    with pytest.raises(RuntimeError, match="host read"):
        rxm.decode._progress(state)
    with pytest.raises(RuntimeError, match="host read"):
        np.asarray(mx.array([1, 2]))
    for _ in range(2):
        state, n = rxm.decode_step(mt, md, state, beam_width=3, beam_length=3, ops=ops, sampling=sampling,
                                   lookup=lookup)
        mx.eval(state.arrays(), n)  # evaluation computes on the device; it reads nothing back
    monkeypatch.undo()
    assert 2 <= min(state.num_out.tolist()) <= 6


def test_default_ops_fall_back_to_reference():
    # importing redrafter_ext.mlx never needs the native extension; without it the reference runs
    native = rxm.native_ops()
    assert rxm.default_ops() is (native or mref)
    for name in ("beam_topk", "build_trie", "tree_mask", "verify_greedy", "verify_sample", "kv_compact"):
        assert callable(getattr(rxm.default_ops(), name))


def _biased_ops():
    """Negative control: verify_sample with halved acceptance uniforms (accepts drafts too often)."""
    from types import SimpleNamespace

    ops = SimpleNamespace(**{n: getattr(mref, n) for n in rxm.decode.OPS})
    ops.verify_sample = lambda lg, b, bn, au, su, *a: mref.verify_sample(lg, b, bn, au * 0.5, su, *a)
    return ops


@pytest.mark.parametrize("method", ["redrafter", "lookup", "autoregressive", "biased"])
def test_generate_first_tokens_follow_target(method, tmp_path):
    # end to end: many rows of one prompt; the first 3 generated tokens (the prefill sample, then
    # one or two speculative steps) against the target's enumerated joint distribution
    import test_sampling as ts  # tests/ is on sys.path (conftest.py)

    Vs, B, n, temperature, top_k, top_p = 11, 6_000, 3, 1.0, 8, 0.95
    tgt = random_target(vocab=Vs, hidden=32, layers=1, seed=3)
    tgt.save_pretrained(tmp_path / "t")
    random_drafter(tgt).save_pretrained(tmp_path / "d")
    mt = rxm.LlamaTarget.from_pretrained(tmp_path / "t")
    md = rxm.Drafter.from_pretrained(tmp_path / "d", dtype=mx.float32)
    prompt = [1, 4, 2, 7]
    truth = ts.joint_first_tokens(tgt, prompt, n, temperature, top_k, top_p)
    kw = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=11)
    if method in ("redrafter", "lookup", "biased"):
        ops = _biased_ops() if method == "biased" else mref
        # lookup: keys of the prompt recur after its first token, so the lookup beam proposes real drafts
        out = rxm.generate(mt, md, [prompt] * B, n, beam_width=3, beam_length=3, ops=ops,
                           lookup=2 if method == "lookup" else 0, **kw)
        assert out.tokens_per_step > 1.05  # speculation really commits several tokens per step
    else:
        out = rxm.autoregressive_generate(mt, [prompt] * B, n, **kw)
    x = torch.tensor(out.tokens)
    code = (x[:, 0] * Vs + x[:, 1]) * Vs + x[:, 2]
    stat, dof, pval = ts.chi_square(torch.bincount(code, minlength=Vs**n).double(), truth * B)
    print(f"{method}: chi2={stat:.1f} dof={dof} p={pval:.3g} tokens/step={out.tokens_per_step:.2f}")
    if method == "biased":
        assert pval < 1e-6  # the test has the power to see a wrong acceptance rule
    else:
        assert pval > 0.01


# ------------------------------------------------------------------------------------------------
# cache room, state checks, generate's arguments (the torch loop's rules, tests/test_decode.py)


@pytest.mark.parametrize("ops", OPS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_cache_overflow_stops_and_flags_the_row(tiny, ops):
    # S = 12, W=2 L=3 -> N = 5: row 1 (cache_len 8) lacks room. It must commit nothing, be marked
    # done and flagged; the other row steps normally; check_overflow names the row.
    _, _, mt, md = tiny
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11]]
    state = rxm.decode._start(mt, prompts, 4, 4, None, None, None, 0)
    state = dataclasses.replace(state, kv=state.kv[:, :, :, :, :12])
    state.check_overflow()  # no flags yet
    new, n = rxm.decode_step(mt, md, state, beam_width=2, beam_length=3, ops=ops)
    mx.eval(new.arrays(), n)
    assert new.overflow.tolist() == [False, True] and new.done.tolist() == [False, True]
    assert n.tolist()[1] == 0 and new.num_out.tolist()[1] == 0 and new.cache_len.tolist()[1] == 8
    np.testing.assert_array_equal(to_np(new.kv[:, :, 1, :, :8]), to_np(state.kv[:, :, 1, :, :8]))
    # row 0 steps as without the check
    unchecked, _ = rxm.decode_step(mt, md, state, beam_width=2, beam_length=3, ops=ops, check_room=False)
    assert new.out.tolist()[0] == unchecked.out.tolist()[0] and new.num_out.tolist()[0] == unchecked.num_out.tolist()[0]
    assert new.num_out.tolist()[0] >= 1
    with pytest.raises(ValueError, match=r"cache overflow in row 1: cache_len = 8 leaves room for 4 of the S = 12"):
        new.check_overflow()
    # the flag is sticky and exact room (cache_len = S - N) is fine
    newer, _ = rxm.decode_step(mt, md, new, beam_width=2, beam_length=3, ops=ops)
    assert newer.overflow.tolist() == [False, True]
    ok = rxm.decode._start(mt, [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10]], 4, 4, None, None, None, 0)
    ok = dataclasses.replace(ok, kv=ok.kv[:, :, :, :, :12])
    ok, _ = rxm.decode_step(mt, md, ok, beam_width=2, beam_length=3, ops=ops)
    assert ok.overflow.tolist() == [False, False]
    ok.check_overflow()


def test_decode_step_rejects_bad_state(tiny):
    _, _, mt, md = tiny
    replace = dataclasses.replace
    state = rxm.decode._start(mt, [[1, 2, 3], [4, 5], [6]], 8, 4, None, None, None, 0)
    for name, bad, match in [
        ("done", lambda a: a.astype(mx.int32), "state.done must have dtype in .bool"),
        ("num_out", lambda a: a.astype(mx.int64), "state.num_out must have dtype in .int32"),
        ("steps", lambda a: a.astype(mx.float32), "state.steps must have dtype in .int32"),
        ("nodes", lambda a: a.astype(mx.int16), "state.nodes must have dtype in .int32"),
        ("hidden", lambda a: a.astype(mx.int32), "state.hidden must have dtype"),
        ("kv", lambda a: a[:, :, :2], "state.kv has batch 2 but the other fields have B = 3"),
        ("cache_len", lambda a: a[:2], "state.cache_len has batch 2 but the other fields have B = 3"),
        ("max_new_tokens", lambda m: 2.5, "state.max_new_tokens must be an int"),
    ]:
        with pytest.raises((TypeError, ValueError), match=match):
            rxm.decode_step(mt, md, replace(state, **{name: bad(getattr(state, name))}), beam_width=2, beam_length=3)


def test_generate_rejects_bad_arguments_by_name(tiny):
    _, _, mt, md = tiny
    for fn in (lambda p, n: rxm.generate(mt, md, p, n), lambda p, n: rxm.autoregressive_generate(mt, p, n)):
        for prompts, n, exc, message in BAD_GENERATE_ARGS:
            with pytest.raises(exc, match=message):
                fn(prompts, n)
        with pytest.raises(TypeError, match=r"prompts\[0\]\[0\] = 1.0 is not an int token id"):
            fn(mx.array([[1.0, 2.0]]), 4)
    P = mt.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"prompts\[0\] has 3 tokens; .*max_position_embeddings={P}"):
        rxm.generate(mt, md, [[1, 2, 3]], P - 2)


def test_generate_rejects_a_bad_beam_shape_before_any_step(tiny):
    _, _, mt, md = tiny
    for kw, n, message in BAD_BEAM_SHAPES:
        with pytest.raises(ValueError, match=message):
            rxm.generate(mt, md, [[1, 2, 3]], n, **kw)


def test_feature_layers_drafter_is_refused(tmp_path):
    """A drafter trained with kd --feature-layers: a clear error, not a weight mismatch."""
    rx.Drafter(rx.DrafterConfig(32, 100, 1, feature_layers=[2])).save_pretrained(tmp_path / "d")
    with pytest.raises(ValueError, match=r"conditions on target layers \[2\].*MLX backend does not support"):
        rxm.Drafter.from_pretrained(tmp_path / "d")


# ------------------------------------------------------------------------------------------------
# the prompt-lookup beam (lookup=n, docs/lookup.md; the torch loop's tests/test_lookup_decode.py)

# repeats inside the prompts, so that keys occur and the lookup beam proposes real continuations
LOOKUP_PROMPTS = [[5, 17, 3, 9, 22, 5, 17, 3, 9, 41, 8], [60, 2, 60, 2, 60], [11, 12, 13, 14, 11, 12]]


def _history_holds_prompt_and_output(out, prompts) -> None:
    st = out.state
    cache_len = st.cache_len.tolist()
    history = st.history.tolist()
    for b, (p, t) in enumerate(zip(prompts, out.tokens)):
        assert cache_len[b] == len(p) + len(t), b  # every committed token has its K/V slot
        assert history[b][: cache_len[b]] == p + t, b


@pytest.fixture(scope="module")
def lookup_ar(tiny):
    _, _, mt, _ = tiny
    return rxm.autoregressive_generate(mt, LOOKUP_PROMPTS, 24)


@pytest.mark.parametrize("W,L", [(1, 2), (1, 4), (2, 3), (4, 4)])
@pytest.mark.parametrize("lookup", [1, 2, 3])
def test_greedy_with_lookup_equals_ar_and_torch(tiny, lookup_ar, W, L, lookup):
    target, drafter, mt, md = tiny
    got = rxm.generate(mt, md, LOOKUP_PROMPTS, 24, beam_width=W, beam_length=L, lookup=lookup)
    assert got.tokens == lookup_ar.tokens
    want = rx.generate(target, drafter, LOOKUP_PROMPTS, 24, beam_width=W, beam_length=L, ops=rx.reference,
                       lookup=lookup)
    assert got.tokens == want.tokens
    _history_holds_prompt_and_output(got, LOOKUP_PROMPTS)
    # the lookup drafts took the last beam's place: the drafter's trie and cache, no node more
    assert max(got.nodes) <= (1 + W * (L - 1)) * max(got.steps)
    assert got.state.history.shape == (3, got.state.kv.shape[4])
    want_off = rxm.generate(mt, md, LOOKUP_PROMPTS, 24, beam_width=W, beam_length=L, lookup=0)
    assert got.state.kv.shape == want_off.state.kv.shape


def test_lookup_is_on_by_default_and_off_has_no_history(tiny):
    _, _, mt, md = tiny
    out = rxm.generate(mt, md, LOOKUP_PROMPTS, 8, beam_width=2, beam_length=3)
    assert out.state.history is not None
    assert out.steps == rxm.generate(mt, md, LOOKUP_PROMPTS, 8, beam_width=2, beam_length=3, lookup=2).steps
    assert rxm.generate(mt, md, LOOKUP_PROMPTS, 8, beam_width=2, beam_length=3, lookup=0).state.history is None


@pytest.mark.parametrize("ops", OPS, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_lookup_beam_content(tiny, ops):
    # rows: a key that occurred (its continuation replaces the last beam), and one that never did
    # (the drafter's beams unchanged)
    _, _, mt, _ = tiny
    state = rxm.decode._start(mt, [[4, 5, 6, 7, 4, 5], [1, 2, 3]], 8, 9, None, None, None, 0, history=True)
    state = dataclasses.replace(state, token=mx.array([6, 9], dtype=mx.int32))
    beams = mx.array([[[6, 1, 1, 1], [6, 3, 3, 3]], [[9, 2, 2, 2], [9, 8, 8, 8]]], dtype=mx.int32)
    got, hist = rxm.decode._with_lookup_beam(state, beams, 2, ops)
    assert got.shape == (2, 2, 4) and got.dtype == mx.int32
    # row 0: history 4 5 6 7 4 5 + token 6, key (5, 6) at 1..2: continuation 7 4 5
    assert got.tolist() == [[[6, 1, 1, 1], [6, 7, 4, 5]], [[9, 2, 2, 2], [9, 8, 8, 8]]]
    # W = 1: the only beam gives way where a key occurred
    assert rxm.decode._with_lookup_beam(state, beams[:, 1:], 2, ops)[0].tolist() == [[[6, 7, 4, 5]], [[9, 8, 8, 8]]]
    # the guaranteed token is in its slot, nothing else changed
    assert hist[:, :7].tolist() == [[4, 5, 6, 7, 4, 5, 6], [1, 2, 3, 9, 0, 0, 0]]
    assert hist[:, 7:].tolist() == state.history[:, 7:].tolist()


def test_greedy_with_lookup_eos_and_policy(tiny):
    target, drafter, mt, md = tiny
    n = 24
    eos = rxm.autoregressive_generate(mt, LOOKUP_PROMPTS, n).tokens[0][9]
    ar = rxm.autoregressive_generate(mt, LOOKUP_PROMPTS, n, eos_id=eos)
    out = rxm.generate(mt, md, LOOKUP_PROMPTS, n, beam_width=2, beam_length=5, eos_id=eos, lookup=2)
    assert out.tokens == ar.tokens
    _history_holds_prompt_and_output(out, LOOKUP_PROMPTS)
    # under a policy: switches between AR and drafting shapes, one cache sized for the largest trie
    script = [((1, 1), 2), ((2, 3), 1), ((1, 5), 3), ((3, 4), 2)]
    menu = tuple(e for e, _ in script)
    out = rxm.generate(mt, md, LOOKUP_PROMPTS, n, eos_id=eos, policy=_Scripted(script, menu), lookup=2)
    assert out.tokens == ar.tokens
    _history_holds_prompt_and_output(out, LOOKUP_PROMPTS)
    assert out.state.kv.shape[4] >= max(map(len, LOOKUP_PROMPTS)) + n + 1 + 3 * 3  # (3, 4)
    policy = SpeculationPolicy(menu=((1, 1), (1, 3), (2, 4)), probe=2)
    out = rxm.generate(mt, md, LOOKUP_PROMPTS, n, eos_id=eos, policy=policy, lookup=3)
    assert out.tokens == ar.tokens
    _history_holds_prompt_and_output(out, LOOKUP_PROMPTS)
    want = rx.generate(target, drafter, LOOKUP_PROMPTS, n, eos_id=eos, policy=SpeculationPolicy(
        menu=((1, 1), (1, 3), (2, 4)), probe=2), lookup=3, ops=rx.reference)
    assert out.tokens == want.tokens


def test_sampling_with_lookup_reproducible_and_uniform_shape(tiny):
    _, _, mt, md = tiny
    kw = dict(beam_width=2, beam_length=3, temperature=1.0, top_k=20, lookup=2)
    a = rxm.generate(mt, md, LOOKUP_PROMPTS, 16, seed=7, **kw)
    assert a.tokens == rxm.generate(mt, md, LOOKUP_PROMPTS, 16, seed=7, **kw).tokens
    _history_holds_prompt_and_output(a, LOOKUP_PROMPTS)
    # explicit uniforms cover the W beams (the lookup beam is one of them)
    state = rxm.decode._start(mt, LOOKUP_PROMPTS, 8, 7, None, None, None, 0, history=True)
    sampling = rxm.SamplingParams(0.8, 0, 0.9)
    u = (mx.random.uniform(shape=(3, 2, 2), key=mx.random.key(1)), mx.random.uniform(shape=(3,), key=mx.random.key(2)))
    x, nx = rxm.decode_step(mt, md, state, beam_width=2, beam_length=3, ops=mref, sampling=sampling, uniforms=u,
                            lookup=2)
    y, ny = rxm.decode_step(mt, md, state, beam_width=2, beam_length=3, ops=mref, sampling=sampling, uniforms=u,
                            lookup=2)
    assert x.out.tolist() == y.out.tolist() and nx.tolist() == ny.tolist()


def test_lookup_rejects_bad_arguments(tiny):
    _, _, mt, md = tiny
    for bad in (-1, True, 1.5, 1 << 16):
        with pytest.raises(ValueError, match="generate: lookup must be"):
            rxm.generate(mt, md, LOOKUP_PROMPTS, 4, beam_width=2, beam_length=3, lookup=bad)
    state = rxm.decode._start(mt, LOOKUP_PROMPTS, 8, 13, None, None, None, 0)  # no history
    with pytest.raises(ValueError, match="decode_step: lookup must be"):
        rxm.decode_step(mt, md, state, beam_width=2, beam_length=3, lookup=-1)
    with pytest.raises(ValueError, match="decode_step: lookup=2 needs state.history"):
        rxm.decode_step(mt, md, state, beam_width=2, beam_length=3, lookup=2)
    state = rxm.decode._start(mt, LOOKUP_PROMPTS, 8, 13, None, None, None, 0, history=True)
    for bad, msg in ((state.history[:, :-1], "state.history must have S"),
                     (state.history.astype(mx.int64), "state.history must have dtype"),
                     (state.history[:2], "state.history has batch 2"),
                     (state.history[0], "state.history must have")):
        with pytest.raises((ValueError, TypeError), match=msg):
            rxm.decode_step(mt, md, dataclasses.replace(state, history=bad), beam_width=2, beam_length=3, lookup=2)
    # the lookup beam adds no node: where the drafter's trie fits (1 + 2*2 = 5 slots, S = 6), so does it
    st = rxm.decode._start(mt, [[1, 2, 3]], 2, 1, None, 6, None, 0, history=True)
    st = dataclasses.replace(st, out=mx.zeros((1, 2 + 3), dtype=mx.int32))  # max_new_tokens + L columns
    rxm.decode_step(mt, md, st, beam_width=2, beam_length=3)
    rxm.decode_step(mt, md, st, beam_width=2, beam_length=3, lookup=2)
    with pytest.raises(ValueError, match="the trie needs N"):  # 1 + 3*2 = 7 slots do not fit, lookup or not
        rxm.decode_step(mt, md, st, beam_width=3, beam_length=3, lookup=2)


def test_lookup_cache_room_is_the_drafters(tiny):
    # S = 12: row 1 (cache_len 6) has room for W=2 L=3 (N = 5) with or without the lookup beam, not for
    # W=3 (N = 7), and then it is stopped the same way with the lookup beam
    _, _, mt, md = tiny
    state = rxm.decode._start(mt, [[1, 2, 3], [4, 5, 6, 7, 8, 9]], 4, 4, None, None, None, 0, history=True)
    state = dataclasses.replace(state, kv=state.kv[:, :, :, :, :12], history=state.history[:, :12])
    for lookup in (0, 2):
        fits, _ = rxm.decode_step(mt, md, state, beam_width=2, beam_length=3, lookup=lookup)
        assert fits.overflow.tolist() == [False, False]
    on, n = rxm.decode_step(mt, md, state, beam_width=3, beam_length=3, lookup=2)
    assert on.overflow.tolist() == [False, True] and n.tolist()[1] == 0 and on.cache_len.tolist()[1] == 6
    assert on.history[1, :6].tolist() == state.history[1, :6].tolist()
    with pytest.raises(ValueError, match="cache overflow in row 1"):
        on.check_overflow()


@pytest.mark.parametrize("seed", [0, 2])
def test_lookup_beam_is_accepted_where_the_text_repeats(seed, tmp_path):
    # a small random target's greedy output falls into a cycle (seed 2: period 2, then 6): the lookup
    # beam proposes the cycle, so a drafter that is always wrong (it drafts a token the output never
    # holds) still commits several tokens a step, also at W = 1 where the lookup drafts replace its beam
    target = random_target(vocab=5, hidden=32, layers=1, seed=seed)
    target.save_pretrained(tmp_path / "t")
    mt = rxm.LlamaTarget.from_pretrained(tmp_path / "t")
    prompt = [[1, 3, 1, 3, 1, 3]]
    ar = rxm.autoregressive_generate(mt, prompt, 64)
    never = min(set(range(5)) - set(ar.tokens[0]))

    class Wrong:
        def beam_search(self, hidden, token, embed_weight, W, L, ops):
            drafts = mx.full((token.shape[0], W, L - 1), never, dtype=mx.int32)
            root = mx.broadcast_to(token[:, None, None].astype(mx.int32), (token.shape[0], W, 1))
            return mx.concatenate([root, drafts], axis=2)

    off = rxm.generate(mt, Wrong(), prompt, 64, beam_width=1, beam_length=4, lookup=0)
    on = rxm.generate(mt, Wrong(), prompt, 64, beam_width=1, beam_length=4, lookup=2)
    assert on.tokens == off.tokens == ar.tokens
    assert ar.tokens == rx.autoregressive_generate(target, prompt, 64).tokens  # the torch twin's cycle
    assert off.steps[0] == 64  # the drafter alone never gets a draft accepted
    assert on.steps[0] <= 0.6 * off.steps[0]
    _history_holds_prompt_and_output(on, prompt)
