#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU and a CUDA torch already installed (the device
# image: python3 with torch 2.11+cu130, nvcc, scikit-build-core, nanobind, cmake, ninja; no network):
#   bench/gpu_check.sh            build, GPU tests, GPU timing
#   bench/gpu_check.sh --dry-run  everything but the GPU steps, on any machine (what CI can check)
# 1. builds the package with the CUDA kernels required (REDRAFTER_CUDA=ON, sm_80 + sm_90) from
#    this checkout into a private folder (.gpu-site, put first on PYTHONPATH), never installing
#    from the network and never touching the interpreter's own packages,
# 2. runs the CUDA tests (CUDA ops == CPU ops, opcheck, CUDA-graph capture and replay of
#    decode_step greedy and sampling, verify_sample == reference and its chi-square exactness
#    test: tests/test_cuda_device.py, and the paged cache on the GPU),
# 3. times every op against its reference torch composition and the copy-bandwidth bound
#    (bench/gpu_bench.py).
# The log goes to one file: GPU_CHECK_LOG, else $OUT/gpu_check.txt when $OUT is a folder (the
# device tool's), else bench/results/gpu_check.txt. Budget: < 6 min on an H200.
# Environment: PYTHON (default python3), CUDACXX (default: nvcc on PATH or /usr/local/cuda/bin).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
dry=0
[ "${1:-}" = "--dry-run" ] && dry=1
PY=${PYTHON:-python3}
if [ -n "${GPU_CHECK_LOG:-}" ]; then log=$GPU_CHECK_LOG
elif [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then log=$OUT/gpu_check.txt
else log=bench/results/gpu_check.txt; fi
mkdir -p "$(dirname "$log")"
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1  # no network there: fail rather than download
export REDRAFTER_CUDA=ON REDRAFTER_TORCH=ON REDRAFTER_MLX=OFF PYTHONUNBUFFERED=1
fail() { echo "gpu_check: $*" >&2; exit 2; }
command -v "$PY" >/dev/null || fail "no $PY (set PYTHON to the interpreter that has torch)"
if [ $dry = 0 ]; then command -v nvidia-smi >/dev/null || fail "no nvidia-smi: this needs an NVIDIA GPU (or --dry-run)"; fi
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
  [ -x /usr/local/cuda/bin/nvcc ] || fail "no nvcc (set CUDACXX): the CUDA kernels cannot be compiled"
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
"$PY" -c 'import torch, scikit_build_core, nanobind' 2>/dev/null \
  || fail "$PY needs torch and scikit-build-core (and nanobind, cmake, ninja) installed"
if [ $dry = 0 ]; then
  "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' || fail "$PY's torch is not a CUDA build"
fi
start=$(date +%s)
site=$root/.gpu-site
{
  echo "# gpu_check $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$([ $dry = 1 ] && echo ' (dry run)')"
  if [ $dry = 0 ]; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; fi
  echo "python $("$PY" -c 'import sys; print(sys.version.split()[0])') at $(command -v "$PY"), nvcc: $("${CUDACXX:-nvcc}" --version | tail -1)"
  echo "## build ($(( $(date +%s) - start )) s)"
  rm -rf "$site"
  "$PY" -m pip install -q --no-build-isolation --no-deps --target "$site" -C build-dir="$root/build/gpu-check" "$root"
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  DRY=$dry "$PY" - <<'PY'
import os
import torch
import redrafter_ext  # noqa: F401
print("torch", torch.__version__, "cuda", torch.version.cuda, "module", redrafter_ext.__file__)
for name in redrafter_ext.ops.NATIVE_OPS:
    assert torch._C._dispatch_has_kernel_for_dispatch_key(f"redrafter::{name}", "CUDA"), f"no CUDA kernel for {name}"
if os.environ["DRY"] == "0":
    assert torch.cuda.is_available(), "torch sees no GPU"
    print("device", torch.cuda.get_device_name())
PY
  rc=0
  tests=(tests/test_cuda_device.py tests/test_paged.py::test_cuda_device)
  if [ $dry = 1 ]; then
    echo "## tests collected, not run (dry run)"
    "$PY" -m pytest -q --collect-only -p no:cacheprovider "${tests[@]}" | tail -1 || rc=$?
    "$PY" -c 'import ast, sys; ast.parse(open("bench/gpu_bench.py").read())' || rc=$?
  else
    echo "## tests ($(( $(date +%s) - start )) s)"
    timeout 300 "$PY" -m pytest -q -ra -p no:cacheprovider "${tests[@]}" || rc=$?
    echo "## timing ($(( $(date +%s) - start )) s)"
    timeout 180 "$PY" bench/gpu_bench.py || rc=$?
  fi
  echo "## done in $(( $(date +%s) - start )) s, status $rc"
  exit $rc
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
