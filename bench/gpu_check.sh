#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU (not runnable on the CPU-only dev machines):
#   bench/gpu_check.sh
# 1. sets up a separate venv (.venv-gpu) with a CUDA torch and builds the package with the CUDA
#    kernels required (REDRAFTER_CUDA=ON; our .cu files include no torch headers, so no
#    TORCH_CUDA_ARCH_LIST is needed; they are compiled for sm_80 and sm_90),
# 2. runs the CUDA tests (CUDA ops == CPU ops, opcheck, CUDA-graph capture and replay of
#    decode_step, verify_sample == reference and its chi-square exactness test:
#    tests/test_cuda_device.py) plus the native CPU suite as a sanity check,
# 3. times every op against its reference torch composition and the copy-bandwidth bound
#    (bench/gpu_bench.py).
# Everything goes to one file: $OUT (default bench/results/gpu_check.txt). Budget: < 8 min on an
# H200 (venv ~2-3 min, build ~1-2 min, tests ~1 min, timing ~1 min).
# Environment: the current `python` is used when its torch is a CUDA build (the package is then
# built into it with pip --no-build-isolation, no downloads); otherwise run.sh sets up VENV
# (default .venv-gpu) with TORCH_SPEC (default torch==2.14.1, a CUDA wheel from the default index
# on Linux). nvcc must be on PATH, in /usr/local/cuda/bin or named by CUDACXX. OUT, PYTHON.
set -euo pipefail
cd "$(dirname "$0")/.."
export TORCH_SPEC=${TORCH_SPEC:-torch==2.14.1}
export VENV=${VENV:-$PWD/.venv-gpu}
export REDRAFTER_CUDA=ON REDRAFTER_MLX=${REDRAFTER_MLX:-OFF}
OUT=${OUT:-bench/results/gpu_check.txt}
mkdir -p "$(dirname "$OUT")"
command -v nvidia-smi >/dev/null || { echo "gpu_check: no nvidia-smi: this needs an NVIDIA GPU" >&2; exit 2; }
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then export CUDACXX=/usr/local/cuda/bin/nvcc
  else echo "gpu_check: no nvcc (set CUDACXX): the CUDA kernels cannot be compiled" >&2; exit 2; fi
fi
start=$(date +%s)
{
  echo "# gpu_check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if python -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null; then
    echo "using $(command -v python) (CUDA torch already installed)"
    python -m pip install -q --no-build-isolation --no-deps .
  else
    ./run.sh setup
    # shellcheck disable=SC1091
    . "$VENV/bin/activate"
  fi
  python - <<'PY'
import torch
import redrafter_ext  # noqa: F401
assert torch.cuda.is_available(), "torch sees no GPU: TORCH_SPEC must name a CUDA build"
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name())
assert torch._C._dispatch_has_kernel_for_dispatch_key("redrafter::beam_topk", "CUDA"), "no CUDA kernels built"
PY
  echo "## tests ($(( $(date +%s) - start )) s)"
  rc=0
  python -m pytest -q -ra tests/test_cuda_device.py tests/test_ops_native.py -p no:cacheprovider || rc=$?
  echo "## timing ($(( $(date +%s) - start )) s)"
  python bench/gpu_bench.py || rc=$?
  echo "## done in $(( $(date +%s) - start )) s, status $rc"
  exit $rc
} 2>&1 | tee "$OUT"
exit "${PIPESTATUS[0]}"
