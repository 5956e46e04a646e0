"""The drafter's prompt pools: deterministic, distinct, and disjoint from the held-out prompts."""

from __future__ import annotations

import re

import pytest

from redrafter_ext.prompts import heldout_prompts
from redrafter_ext.train import prompts as P


@pytest.mark.parametrize("pool", [P.train_prompts, P.broad_prompts])
def test_pools_are_deterministic_distinct_and_never_held_out(pool):
    a, b = pool(), pool()
    assert a == b and len(a) > 2000 and len(set(a)) == len(a)
    assert not set(a) & set(heldout_prompts())
    assert pool(10) == a[:10] and pool(seed=1) != a and sorted(pool(seed=1)) == sorted(a)


def test_broad_pool_is_broad():
    b = P.broad_prompts()
    # many kinds of request and wordings: no opening word dominates, no template left unfilled
    first = [p.split()[0] for p in b]
    assert max(first.count(w) for w in set(first)) < 0.15 * len(b)
    assert not any(re.search(r"\{\w*\}", p) for p in b)
    assert all(p[-1] in ".?!'" for p in b), [p for p in b if p[-1] not in ".?!'"][:5]
    assert sum("Python" in p for p in b) > 50 and sum(any(c.isdigit() for c in p) for p in b) > 250
