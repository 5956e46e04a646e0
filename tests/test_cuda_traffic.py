"""verify_sample's one-pass filter (csrc/cuda/verify_sample.cu) in the emulator: its results against
the reference (the same margin rule as tests/test_cuda_emulated.py), the general multi-pass path it
falls back to, and the modelled global-memory traffic it reaches with top-k / top-p.
"""

from __future__ import annotations

import pytest
import torch
from emu import emu_build
from test_cuda_emulated import SANITIZE, SEEDS, check_sample, run_sample, sample_case


@pytest.fixture(scope="module")
def emu():
    m = emu_build.build(sanitize=SANITIZE)  # REDRAFTER_EMU_SANITIZE=1: the ASan+UBSan build
    yield m
    m.verify_sample_set_list_slots(-1)


def general_nodes(emu, run) -> int:
    """The visited filtered nodes that took the general path while run() ran."""
    emu.verify_sample_general_nodes()
    run()
    return emu.verify_sample_general_nodes()


@pytest.mark.parametrize("slots", [-1, 0, 1, 2])
def test_filters_every_list_length(emu, slots):
    # 1-2 slots per thread drop most tokens at V=3000 (blocks of 512): the cut then often lies past
    # the candidates and the general path decides; 0 runs only the general path
    emu.verify_sample_set_list_slots(slots)
    try:
        for j, (t, k, p) in enumerate([(1.0, 50, 1.0), (0.7, 0, 0.9), (1.3, 20, 0.8), (2.0, 0, 0.3),
                                        (0.5, 2999, 0.97)]):
            args = sample_case(3, 3, 4, 3000, seed=40 + j, dtype=(torch.float32, torch.bfloat16)[j % 2], boost=4.0)
            check_sample(emu, *args, t, k, p, seeds_=SEEDS[j % 3 : j % 3 + 1])
    finally:
        emu.verify_sample_set_list_slots(-1)


def test_ties_across_lists(emu):
    # few distinct logits over V=5000: long runs of equal keys at the top-k threshold and across the
    # top-p cut, spread over every thread's list
    logits, beams, beam_node, au, su = sample_case(3, 3, 4, 5000, seed=77)
    logits = torch.randint(0, 6, logits.shape, generator=torch.Generator().manual_seed(78)).float()
    logits[0, :, :4] += 8.0  # one row with a few clear winners
    for t, k, p in [(1.0, 7, 1.0), (1.0, 0, 0.5), (1.0, 600, 0.61), (0.5, 0, 0.999), (1.0, 3, 0.9)]:
        check_sample(emu, logits, beams, beam_node, au, su, t, k, p)


def test_typical_rows_take_one_pass(emu):
    # peaked rows (the drafted tokens hold most of the mass, as a confident target's do) at k=50 /
    # p=0.9: no node falls back. (Top-p alone over a heavy tail can need more than the lists hold.)
    args = sample_case(4, 3, 4, 32000, seed=5, dtype=torch.bfloat16, boost=14.0)
    for t, k, p in [(0.8, 50, 0.9), (0.8, 0, 0.9), (1.0, 50, 1.0)]:
        n = general_nodes(emu, lambda t=t, k=k, p=p: check_sample(emu, *args, t, k, p, seeds_=SEEDS[:1]))
        assert n == 0, (t, k, p, n)


def test_flat_top_p_falls_back(emu):
    # a flat row with top-p alone: the kept set exceeds the lists, the general path decides (counted)
    args = sample_case(2, 2, 3, 20000, seed=9, boost=0.0)
    n = general_nodes(emu, lambda: check_sample(emu, *args, 2.0, 0, 0.95, seeds_=SEEDS[:1]))
    assert n > 0


def visited_rows(acc: torch.Tensor) -> int:
    return int((acc + 1).sum())


@pytest.mark.parametrize("t,k,p", [(0.8, 50, 0.9), (0.8, 0, 0.9), (1.0, 50, 1.0)])
def test_filtered_traffic_near_one_read(emu, t, k, p):
    """With top-k / top-p the logits are read about once per visited node (was 10-16x)."""
    B, W, L, V = 2, 4, 4, 32000
    logits, beams, beam_node, au, su = sample_case(B, W, L, V, seed=3, dtype=torch.bfloat16, boost=14.0)
    emu.traffic_start(1)
    acc = run_sample(emu, logits, beams, beam_node, au, su, t, k, p, seed=1)[0]
    launches, sizes = emu.traffic_stop()
    logits_read = sum(ln["region_read"].get("logits", 0) for ln in launches)
    read16 = sum(ln["read_by_width"].get(16, 0) for ln in launches)
    read = sum(sum(ln["read_by_width"].values()) for ln in launches)
    minimum = visited_rows(acc) * V * 2
    assert logits_read <= 1.05 * minimum, (logits_read / minimum)
    assert read16 >= 0.9 * read


@pytest.mark.parametrize("V,dtype", [(20001, torch.float16), (32000, torch.float32), (12347, torch.bfloat16)])
def test_unfiltered_tiles(emu, V, dtype):
    # the final sample starts at the crossing's tile: odd V (rows off 16-byte boundaries), uniforms
    # near 0 and 1 (first and last tile), rejections before the stop
    logits, beams, beam_node, au, su = sample_case(6, 3, 4, V, seed=V, dtype=dtype, boost=6.0)
    su = torch.tensor([0.0, 0.999, 0.5, 0.25, 0.9999, 0.75])
    au[1] = 0.999  # row 1 rejects every child
    for t in (1.0, 0.6):
        check_sample(emu, logits, beams, beam_node, au, su, t, 0, 1.0)


def test_unfiltered_traffic(emu):
    """Without filters: one read of the visited rows, plus one tile of each stop node's row."""
    B, W, L, V = 3, 4, 4, 32000
    logits, beams, beam_node, au, su = sample_case(B, W, L, V, seed=4, dtype=torch.bfloat16, boost=6.0)
    emu.traffic_start(1)
    acc = run_sample(emu, logits, beams, beam_node, au, su, 1.0, 0, 1.0, seed=2)[0]
    launches, _ = emu.traffic_stop()
    logits_read = sum(ln["region_read"].get("logits", 0) for ln in launches)
    minimum = visited_rows(acc) * V * 2
    tile = 4096  # elements: a power of two >= one scan step (512 threads x 8) and >= V / 16
    assert logits_read <= minimum + B * tile * 2 + 64, (logits_read / minimum, acc)
