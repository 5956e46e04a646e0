"""The native extension: registration, CUDA kernels compiled in when nvcc exists, opcheck."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import redrafter_ext as rx


def test_ops_registered_for_cpu():
    for name in rx.ops.NATIVE_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"redrafter::{name}", "CPU"), name


@pytest.mark.skipif(
    not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc")) or os.environ.get("REDRAFTER_CUDA") == "OFF",
    reason="no nvcc on this machine: the build skips the CUDA kernels by design",
)
def test_cuda_kernels_compiled_in():
    # nvcc is present (here and in CI): the module must carry CUDA kernels and still import without a GPU
    for name in rx.ops.NATIVE_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"redrafter::{name}", "CUDA"), name


@pytest.mark.parametrize("packed", [False, True])
def test_tree_mask_opcheck(packed):
    beams = torch.tensor([[[1, 2, 3], [1, 2, 4], [1, 5, 3]], [[0, 0, 0], [0, 0, 0], [0, 1, 1]]])
    _, parent, _, _, num_nodes = rx.reference.build_trie(beams)
    torch.library.opcheck(torch.ops.redrafter.tree_mask.default, (parent, num_nodes, packed))
    torch.library.opcheck(torch.ops.redrafter.tree_mask.default, (parent.long(), num_nodes.long(), packed))


def test_tree_mask_native_rejects_bad_input():
    with pytest.raises(ValueError, match="node_parent must have 2 dims"):
        rx.ops.tree_mask(torch.zeros(3, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="num_nodes must have dtype"):
        rx.ops.tree_mask(torch.zeros(1, 3, dtype=torch.int32), torch.zeros(1))
    with pytest.raises(ValueError, match=r"node_parent\[0, 2\] = 2"):
        rx.ops.tree_mask(torch.tensor([[-1, 0, 2]]), torch.tensor([3]))
    with pytest.raises(ValueError, match=r"num_nodes\[0\] = 4"):
        rx.ops.tree_mask(torch.tensor([[-1, 0, 1]]), torch.tensor([4]))


def test_mlx_backend_built_and_torch_free():
    # with mlx installed (CI installs mlx[cpu]) the build must carry the native MLX module, and the MLX
    # backend must import and run with torch unavailable (an MLX-only install on macOS)
    pytest.importorskip("mlx.core")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import mlx.core as mx\n"
        "import redrafter_ext.mlx as m\n"
        "from redrafter_ext.mlx import ops\n"
        "assert m.default_ops() is ops, m.default_ops()\n"
        "print(ops.build_trie(mx.array([[[1, 2], [1, 3]]]))[4].tolist())\n"
        "assert not any(k == 'torch' or k.startswith('torch.') for k, v in sys.modules.items() if v is not None)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy())
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[3]"


# ---- packaging and set-up ---------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[1]


def _torch_minor() -> str:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return f"{major}.{minor}"


def test_installed_distribution_pins_the_torch_it_was_built_with():
    # the compiled ops follow libtorch's C++ ABI of this minor release: the wheel must say so
    reqs = importlib.metadata.requires("redrafter_ext") or []
    torch_reqs = [r for r in reqs if r.split(";")[0].strip().startswith("torch")]
    assert torch_reqs == [f"torch=={_torch_minor()}.*"], reqs
    assert {"numpy", "safetensors", "tqdm", "tokenizers"} <= {r.split(";")[0].strip() for r in reqs}
    mlx_extra = [r for r in reqs if "extra == \"mlx\"" in r]
    assert any(r.startswith("mlx[cpu]") and "linux" in r for r in mlx_extra), reqs
    mlx_lm_extra = [r for r in reqs if "extra == \"mlx-lm\"" in r]  # the mlx-lm adapter's: mlx and mlx-lm
    assert any(r.startswith("mlx-lm") for r in mlx_lm_extra) and any(r.startswith("mlx[cpu]") for r in mlx_lm_extra), reqs


def test_torch_pin_provider():
    spec = importlib.util.spec_from_file_location("torch_pin", ROOT / "buildtools" / "torch_pin.py")
    pin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pin)
    assert pin.torch_requirement("torch>=2.4", "2.13.0+cpu") == "torch==2.13.*"
    assert pin.torch_requirement("torch>=2.4", "2.14.1") == "torch==2.14.*"
    assert pin.dynamic_metadata("dependencies", {"torch": "torch>=2.4", "base": ["numpy"]}) == [
        f"torch=={_torch_minor()}.*", "numpy"]
    with pytest.MonkeyPatch.context() as m:
        m.setenv("REDRAFTER_TORCH", "OFF")  # no torch module compiled: no pin
        assert pin.dynamic_metadata("dependencies", {"torch": "torch>=2.4"}) == ["torch>=2.4"]
    with pytest.raises(RuntimeError, match="dependencies only"):
        pin.dynamic_metadata("version", {})


def test_readme_wheel_command_and_gitignore():
    readme = (ROOT / "README.md").read_text()
    assert "pip wheel --no-build-isolation --no-deps -w dist/ ." in readme
    assert "pip wheel --no-build-isolation .  " not in readme and "pip wheel --no-build-isolation .\n" not in readme
    assert "glibc >= 2.35" in readme and "C++20" in readme
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "dist/" in ignored and "*.whl" in ignored


def _run_sh(*args, env=None):
    e = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", str(ROOT / "run.sh"), *args], capture_output=True, text=True, env=e, timeout=60)


def test_run_sh_help():
    for args in ((), ("help",), ("--help",)):
        r = _run_sh(*args)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("One entry point") and "./run.sh demo" in r.stdout
        assert "set -euo" not in r.stdout and "#" not in r.stdout
    r = _run_sh("frobnicate")
    assert r.returncode == 2 and "unknown job: frobnicate" in r.stderr
    r = _run_sh("bench", "--help")  # lists the scripts instead of running `python --help`
    assert r.returncode == 0 and "bench/bench_ops.py" in r.stdout and "usage: ./run.sh bench" in r.stdout
    assert "python [option]" not in r.stdout + r.stderr
    r = _run_sh("bench", "bench/no_such.py")
    assert r.returncode == 2 and "no benchmark script bench/no_such.py" in r.stderr


@pytest.mark.skipif(sys.platform != "linux", reason="the glibc check is for the Linux mlx[cpu] wheel")
@pytest.mark.parametrize("glibc,mlx", [("2.31", False), ("2.34", False), ("2.35", True), ("2.39", True)])
def test_run_sh_skips_mlx_on_old_glibc(tmp_path, glibc, mlx):
    fake = tmp_path / "getconf"
    fake.write_text(f"#!/bin/sh\necho 'glibc {glibc}'\n")
    fake.chmod(0o755)
    env = {"PATH": f"{tmp_path}:{os.environ['PATH']}"}
    env_clean = {k: v for k, v in os.environ.items() if k != "MLX_SPEC"}
    r = subprocess.run(["bash", str(ROOT / "run.sh"), "deps"], capture_output=True, text=True,
                       env=dict(env_clean, **env), timeout=60)
    assert r.returncode == 0, r.stderr
    assert any(line.startswith("mlx[cpu]") for line in r.stdout.splitlines()) == mlx
    assert any(line.startswith("mlx-lm") for line in r.stdout.splitlines()) == mlx  # mlx-lm goes with MLX
    skipped = [line for line in r.stderr.splitlines() if "skipping the MLX backend" in line]
    assert len(skipped) == (0 if mlx else 1)
    if not mlx:
        assert f"needs glibc >= 2.35, this system has {glibc}" in skipped[0]
