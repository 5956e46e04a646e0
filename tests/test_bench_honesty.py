"""Benchmarks that cannot lie: interleaved timing, load and threads recorded, impossible speedups
flagged, error bars; the thread count chosen from the free cores; the demo's --help shows its
defaults and its docstring agrees with them."""

from __future__ import annotations

import csv
import importlib.util
import re
from pathlib import Path

import pytest

from redrafter_ext import profiling

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_interleaved_alternates_methods():
    e2e = _load("e2e")
    calls = []
    t_ar, t_rd = e2e.interleaved(lambda: calls.append("ar"), lambda: calls.append("rd"), 4)
    assert calls == ["ar", "rd", "rd", "ar", "ar", "rd", "rd", "ar"]
    assert len(t_ar) == len(t_rd) == 4


def test_e2e_csv_records_load_threads_and_flags(tmp_path):
    e2e = _load("e2e")
    assert e2e.main(["--model", "tiny", "--widths", "1", "--lengths", "3", "--runs", "2", "--max-new-tokens", "8",
                     "--prompts", "1", "--threads", "1", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "e2e.csv")))
    assert rows
    for r in rows:
        assert r["threads"] == "1" and float(r["loadavg1"]) >= 0
        lo, mid, hi = float(r["speedup_min"]), float(r["speedup"]), float(r["speedup_max"])
        assert lo <= mid <= hi
        # a speedup above tokens/step must be flagged, and only then
        assert (r["suspect"] != "") == (mid > float(r["tokens_per_step"]))
    assert [r["W"] for r in rows][-1] == "auto" and float(rows[-1]["vs_best"]) > 0  # the policy's row
    assert (tmp_path / "e2e.png").is_file()


def test_choose_threads_uses_free_cores(monkeypatch):
    monkeypatch.setattr(profiling, "cpu_cores", lambda: 2)
    monkeypatch.setattr(profiling.os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    assert profiling.choose_threads() == (2, None)
    monkeypatch.setattr(profiling.os, "getloadavg", lambda: (1.2, 1.0, 1.0))
    n, warning = profiling.choose_threads()
    assert n == 1 and warning is None  # one core busy elsewhere: use the other
    monkeypatch.setattr(profiling.os, "getloadavg", lambda: (3.5, 3.0, 3.0))
    n, warning = profiling.choose_threads()
    assert n == 1 and "load average 3.5" in warning
    n, warning = profiling.choose_threads(2)  # asked for explicitly: honoured, and warned about
    assert n == 2 and "exceeds" in warning


def test_demo_help_shows_defaults_and_docstring_matches(capsys):
    from redrafter_ext import demo

    with pytest.raises(SystemExit):
        demo.main(["--help"])
    out = " ".join(capsys.readouterr().out.split())  # help lines wrap anywhere
    p = demo.build_parser()
    W, L = p.get_default("beam_width"), p.get_default("beam_length")
    assert re.search(rf"--beam-width.*\(default: {W}\)", out, re.S)
    assert re.search(rf"--beam-length.*\(default: {L}\)", out, re.S)
    assert f"(default: {p.get_default('model')})" in out
    # the docstring's example line for the default run names the real defaults
    first = next(line for line in demo.__doc__.splitlines() if "python -m redrafter_ext.demo" in line)
    assert f"W={W} L={L}" in first and p.get_default("model") in first.lower()
    assert f"{p.get_default('prompts')} held-out prompts" in first


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_batch_bench_rows_policy_and_no_idle_steps(tmp_path, temperature):
    batch = _load("batch")
    assert batch.main(["--model", "tiny", "--batches", "1", "3", "--configs", "1x3", "2x3", "--runs", "2",
                       "--max-new-tokens", "8", "--rows", "3", "--threads", "1", "-T", str(temperature),
                       "--out", str(tmp_path), "--name", "b"]) == 0
    rows = list(csv.DictReader(open(tmp_path / "b.csv")))
    assert [(r["method"], r["B"]) for r in rows] == [(m, B) for B in ("1", "3") for m in ("ar", "1x3", "2x3", "policy")]
    for r in rows:
        assert r["threads"] == "1" and float(r["loadavg1"]) >= 0 and float(r["temperature"]) == temperature
        lo, hi = map(float, r["speedup_spread"].split(".."))
        assert lo - 0.01 <= float(r["speedup"]) <= hi + 0.01
        assert (r["suspect"] != "") == (float(r["speedup"]) > float(r["tokens_per_step"]) * 1.0001)
        assert r["idle_steps"] == "0"  # generate reads "all done" before any step could run idle
        if r["method"] == "policy":
            assert r["best_static"] in ("1x3", "2x3") and float(r["vs_best"]) > 0
    assert (tmp_path / "b.png").is_file()
