"""In-flight batching (``rx.Batch``): requests admitted into and retired from a running batch give
each request its own batch-1 greedy output, contiguous and paged, with blocks reused and no leak."""

from __future__ import annotations

import pytest
import torch
from helpers import random_drafter, random_target
from test_decode import NoHostSync, _forbidden

import redrafter_ext as rx

REQUESTS = [  # prompt, max_new_tokens, eos (index into its own free output, or None)
    ([5, 17, 3, 9, 22, 41, 8], 20, None),
    ([60, 2], 12, 4),
    ([11, 12, 13, 14], 16, None),
    ([7, 7, 8], 9, None),
    ([30, 31, 32, 33, 34, 35], 14, 6),
]


@pytest.fixture(scope="module")
def target():
    return random_target(vocab=97, hidden=64, layers=2, seed=0)


@pytest.fixture(scope="module")
def expected(target):
    """Each request's own batch-1 greedy output and its eos id."""
    out = []
    for prompt, n, eos_at in REQUESTS:
        free = rx.autoregressive_generate(target, [prompt], n).tokens[0]
        eos = None if eos_at is None else free[eos_at]
        out.append((eos, rx.autoregressive_generate(target, [prompt], n, eos_id=eos).tokens[0]))
    return out


def serve(target, drafter, expected, **batch_kw):
    """Three rows, five requests arriving at different steps; returns {request: tokens}."""
    batch = rx.Batch(target, 3, 20, 64, beam_width=2, beam_length=4, **batch_kw)
    arrivals = {0: [0, 1], 2: [2], 3: [3], 5: [4]}
    waiting, row_of, got = [], {}, {}
    for t in range(200):
        waiting += arrivals.get(t, [])
        while waiting and batch.free_rows:
            r = waiting.pop(0)
            prompt, n, _ = REQUESTS[r]
            row_of[batch.admit(prompt, max_new_tokens=n, eos_id=expected[r][0])] = r
        if not batch.busy and not waiting and t > max(arrivals):
            break
        batch.step(drafter)
        for row in batch.finished():
            got[row_of.pop(row)] = batch.retire(row)
    return got, batch


@pytest.mark.parametrize("paged,lookup", [(False, 0), (True, 0), (False, 2), (True, 3)])
def test_each_request_equals_its_batch1_output(target, expected, paged, lookup):
    drafter = random_drafter(target, seed=2)
    kw = dict(paged=True, block_size=5) if paged else {}
    got, batch = serve(target, drafter, expected, lookup=lookup, **kw)
    assert set(got) == set(range(len(REQUESTS)))
    for r, (_, want) in enumerate(expected):
        assert got[r] == want, r
    assert batch.free_rows == [0, 1, 2]
    if paged:  # every block went back to the pool (parking blocks aside)
        assert batch.pool.free == batch.state.kv.pages.shape[1] - len(batch._park)


def test_reused_blocks_and_rows_carry_nothing_over(target, expected):
    # a pool with room for one request at a time: the second request gets the first one's blocks
    drafter = random_drafter(target, seed=2)
    batch = rx.Batch(target, 2, 20, 64, beam_width=2, beam_length=4, paged=True, block_size=8, num_blocks=1 + 6)
    first = batch.admit(REQUESTS[0][0], max_new_tokens=20)
    blocks = list(batch._blocks[first])
    with pytest.raises(RuntimeError, match="BlockPool"):
        batch.admit(REQUESTS[2][0], max_new_tokens=16)  # exhausted: a clear error
    while not batch.finished():
        batch.step(drafter)
    assert batch.retire(first) == expected[0][1]
    row = batch.admit(REQUESTS[2][0], max_new_tokens=16)
    assert batch._blocks[row] == blocks[: len(batch._blocks[row])]  # the freed blocks, reused
    while not batch.finished():
        batch.step(drafter)
    assert batch.retire(row) == expected[2][1]


def test_bad_requests_leave_other_rows_untouched(target):
    drafter = random_drafter(target)
    batch = rx.Batch(target, 2, 10, 32, beam_width=2, beam_length=3)
    row = batch.admit([1, 2, 3], max_new_tokens=8)
    batch.step(drafter)
    before = {k: v.clone() for k, v in vars(batch.state).items() if isinstance(v, torch.Tensor)}
    with pytest.raises(ValueError, match="busy"):
        batch.admit([4, 5], row=row)
    with pytest.raises(ValueError, match="cache slots"):
        batch.admit(list(range(1, 30)))  # longer than the room left
    with pytest.raises(ValueError, match="max_new_tokens"):
        batch.admit([4, 5], max_new_tokens=11)  # above the batch's output width
    with pytest.raises(ValueError, match="not busy"):
        batch.retire(1)  # a free row
    with pytest.raises(ValueError, match="row must be"):
        batch.retire(7)
    with pytest.raises(ValueError, match="prompts"):
        batch.admit([])
    for k, v in vars(batch.state).items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, before[k]), k
    batch.retire(row)
    with pytest.raises(ValueError, match="not busy"):
        batch.retire(row)  # twice


def test_steps_with_rows_admitted_mid_run_never_sync(target, monkeypatch):
    drafter = random_drafter(target)
    batch = rx.Batch(target, 3, 16, 64, beam_width=4, beam_length=4)
    batch.admit([1, 2, 3, 4])
    batch.step(drafter)
    batch.admit([9, 8])  # admitted while row 0 runs
    for name in ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, _forbidden(name))
    with NoHostSync():
        for _ in range(3):
            batch.step(drafter)
    monkeypatch.undo()
    n = batch.state.num_out.tolist()
    assert n[0] >= 4 and n[1] >= 3 and n[2] == 0, n


def test_docs_example_runs():
    """The in-flight batching example of docs/integration.md, executed as written: every request
    equals its own batch-1 greedy output."""
    import re
    from pathlib import Path

    docs = Path(__file__).resolve().parents[1] / "docs" / "integration.md"
    m = re.search(r"<!-- example: in-flight batching -->\s*```python\n(.*?)```", docs.read_text(), re.S)
    assert m, "docs/integration.md lacks the tested in-flight batching example"
    ns: dict = {}
    exec(compile(m.group(1), str(docs), "exec"), ns)  # noqa: S102  (our own documentation)
    assert sorted(ns["outputs"]) == list(range(len(ns["requests"])))
    for r, prompt in enumerate(ns["requests"]):
        want = rx.autoregressive_generate(ns["target"], [prompt], 16 + 2 * r).tokens[0]
        assert ns["outputs"][r] == want, r


def test_row_uniforms_are_uniform_and_per_row():
    from redrafter_ext.serving import row_uniforms

    seed = torch.tensor([0, 1, 12345, 2**62 + 7])
    counter = torch.tensor([0, 5, 9, 3])
    u = row_uniforms(seed, counter, 50_000)
    assert u.dtype == torch.float32 and u.shape == (4, 50_000)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    # each row's stream depends on its own seed and counter only
    assert torch.equal(row_uniforms(seed[2:3], counter[2:3], 50_000)[0], u[2])
    # chi-square over 64 bins per row (p > 1e-4 at 63 dof: statistic < ~112)
    for row in u:
        counts = torch.bincount((row * 64).long(), minlength=64).double()
        stat = float(((counts - row.numel() / 64) ** 2 / (row.numel() / 64)).sum())
        assert stat < 112, stat
    assert not torch.equal(u[0], u[1])


@pytest.mark.parametrize("lookup", [0, 2])
def test_sampled_request_does_not_depend_on_its_batch(target, lookup):
    drafter = random_drafter(target, seed=4)
    params = rx.SamplingParams(1.0, 20, 0.95)

    def alone(prompt, seed):
        b = rx.Batch(target, 1, 16, 64, beam_width=2, beam_length=3, sampling=params, lookup=lookup)
        b.admit(prompt, seed=seed)
        while not b.finished():
            b.step(drafter)
        return b.retire(0)

    want = alone([5, 17, 3, 9], seed=11)
    assert want != alone([5, 17, 3, 9], seed=12)  # another seed, another sample (16 tokens at T=1)
    b = rx.Batch(target, 3, 16, 64, beam_width=2, beam_length=3, sampling=params, lookup=lookup)
    b.admit([60, 2], seed=1)
    b.step(drafter)
    row = b.admit([5, 17, 3, 9], seed=11)  # admitted mid-run, beside other rows
    b.admit([11, 12, 13], seed=2)
    while row not in b.finished():
        b.step(drafter)
    assert b.retire(row) == want
