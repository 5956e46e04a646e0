"""The native extension: registration, CUDA kernels compiled in when nvcc exists, opcheck."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

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
    for name in rx.ops.CUDA_OPS:
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
