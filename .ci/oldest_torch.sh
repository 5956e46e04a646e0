#!/usr/bin/env bash
# Builds the extension with nvcc against the oldest torch we support (2.11: the GPU image's torch,
# a CUDA 13.0 wheel) in its own venv, with the exact CUDA flags of the GPU build, and checks that
# every symbol the module needs is defined by that torch's libraries, the C/C++ runtime or Python.
# The wheel cannot be imported here (its NVIDIA libraries are not installed): only its headers and
# libtorch are used, found without importing it (REDRAFTER_TORCH_NO_IMPORT).
# Environment: PYTHON (default python3), TORCH_OLDEST (default 2.11.0), VENV_OLDEST.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
PYTHON=${PYTHON:-python3}
TORCH_OLDEST=${TORCH_OLDEST:-2.11.0}
VENV=${VENV_OLDEST:-$root/.venv-torch-oldest}
say() { printf '[oldest_torch] %s\n' "$*" >&2; }
if [ -z "${CUDACXX:-}" ] && ! command -v nvcc >/dev/null; then
  [ -x /usr/local/cuda/bin/nvcc ] || { say "no nvcc: nothing to check"; exit 2; }
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
vpy=$VENV/bin/python
# outputs are captured before grep: under pipefail, `cmd | grep -q` fails whenever grep exits on its
# match before cmd has written everything (cmd dies of SIGPIPE; this failed CI once)
installed=$("$vpy" -m pip show torch 2>/dev/null || true)
if ! grep -q "^Version: ${TORCH_OLDEST}$" <<<"$installed"; then
  say "installing torch==$TORCH_OLDEST without its NVIDIA dependencies (headers and libtorch only)"
  "$vpy" -m pip install -q --no-deps "torch==$TORCH_OLDEST"
fi
"$vpy" -m pip install -q "scikit-build-core>=0.10" "nanobind>=3,<4" "cmake>=3.26" ninja
tver=$("$vpy" -m pip show torch | sed -n 's/^Version: //p')
say "building against torch $tver ($(( $(date +%s) - start )) s)"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
REDRAFTER_TORCH=ON REDRAFTER_CUDA=ON REDRAFTER_MLX=OFF "$vpy" -m pip wheel -q --no-build-isolation --no-deps \
  -C cmake.define.REDRAFTER_TORCH_NO_IMPORT=ON -C build-dir="$root/build/torch-$TORCH_OLDEST" -w "$out" "$root"
(cd "$out" && "$vpy" -m zipfile -e ./*.whl x >/dev/null)
so=$(ls "$out"/x/redrafter_ext/_C*.so)
tdir=$("$vpy" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')
# a module's undefined symbols resolve at load time in what it links (c10, torch, torch_cpu and
# their system dependencies) or in the interpreter: anything else would fail the import there
"$vpy" - "$so" "$tdir/lib" <<'PY'
import re, subprocess, sys
so, lib = sys.argv[1], sys.argv[2]
def syms(path, flag):
    out = subprocess.run(["nm", "-D", flag, path], check=True, capture_output=True, text=True).stdout
    return {m.group(2).split("@")[0] for m in re.finditer(r"^\s*(?:[0-9a-f]+\s+)?([A-Za-z])\s+(\S+)$", out, re.M)
            if flag == "--defined-only" or m.group(1) == "U"}
need = syms(so, "--undefined-only")
have = set()
for name in ("libc10.so", "libtorch.so", "libtorch_cpu.so"):
    have |= syms(f"{lib}/{name}", "--defined-only")
ldd = subprocess.run(["ldd", so], capture_output=True, text=True).stdout
for path in re.findall(r"^\s*(?:\S+\s+=>\s+)?(/\S+)", ldd, re.M):  # the loader has no "=>"
    have |= syms(path, "--defined-only")
missing = sorted(s for s in need - have if not re.match(r"_?Py|__gmon_start__|_ITM_|__cxa_finalize", s))
if missing:
    sys.exit("undefined in torch's libraries:\n  " + "\n  ".join(missing))
print(f"[oldest_torch] {so.rsplit('/', 1)[-1]}: all {len(need)} undefined symbols resolve against {lib}")
PY
sections=$(readelf -S "$so")
grep -q nv_fatbin <<<"$sections" || { say "the module has no CUDA kernels"; exit 1; }
say "ok: torch $tver, CUDA kernels compiled and linked ($(( $(date +%s) - start )) s)"
