"""Every CUDA kernel carries launch bounds that its registers fit (checked from ptxas, no GPU needed).

A launch whose block needs more registers than one SM has fails on the device with "too many
resources requested"; the CPU emulator cannot see that, ptxas can.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HAVE_NVCC = bool(os.environ.get("CUDACXX") or shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"))


def _report_module():
    spec = importlib.util.spec_from_file_location("ptxas_report", ROOT / "bench" / "ptxas_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not HAVE_NVCC, reason="no nvcc on this machine")
def test_every_kernel_has_launch_bounds_that_fit():
    mod = _report_module()
    rows = mod.report((80, 90))
    kernels = {r["kernel"].split("<", 1)[0] for r in rows}
    # every op family's kernels were found (a parse failure must not pass as "no problems")
    for k in ("build_trie_kernel", "tree_mask_bool_kernel", "copy_kernel", "verify_sample_kernel",
              "ngram_lookup_kernel"):
        assert k in kernels, sorted(kernels)
    assert all("regs" in r for r in rows), [r["kernel"] for r in rows if "regs" not in r]
    assert mod.problems(rows) == []


def test_problems_flags_missing_bounds_and_register_overflow():
    mod = _report_module()
    rows = [
        {"file": "a.cu", "kernel": "k", "arch": 90, "bound": None, "regs": 32},
        {"file": "a.cu", "kernel": "big", "arch": 90, "bound": 1024, "regs": 65},
        {"file": "a.cu", "kernel": "ok", "arch": 90, "bound": 1024, "regs": 64},
    ]
    got = mod.problems(rows)
    assert len(got) == 2 and "no __launch_bounds__" in got[0] and "65 registers x 1024" in got[1]
