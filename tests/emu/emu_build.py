"""Build (once per source hash) and load the emulation test module ``redrafter_emu``.

Every ``csrc/cuda/*.cu`` plus the negative controls (tests/emu/negative.cu) is compiled with g++
as C++ against the host shim (tests/shim), then linked with the pybind11 bindings
(tests/emu/module.cpp). Results are cached under tests/.emu_build/<hash>/ (ignored by git); the
hash covers the sources, the shim and the flags. ``sanitize=True`` builds an ASan+UBSan variant,
which must be loaded in a process started with LD_PRELOAD of libasan (see test_cuda_emulated.py).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sysconfig
from pathlib import Path

import pybind11

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "tests" / ".emu_build"
CXX = os.environ.get("CXX", "g++")
BASE_FLAGS = ["-std=c++20", "-fPIC", "-DREDRAFTER_EMULATE", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-Wno-unknown-pragmas"]
OPT_FLAGS = ["-O2", "-g0"]
SAN_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]


def sources() -> list[Path]:
    cu = sorted((ROOT / "csrc" / "cuda").glob("*.cu")) + [ROOT / "tests" / "emu" / "negative.cu"]
    return cu + [ROOT / "tests" / "emu" / "module.cpp"]


def _headers() -> list[Path]:
    return sorted((ROOT / "csrc" / "cuda").glob("*.h*")) + sorted((ROOT / "tests" / "shim").glob("*.h"))


def build(sanitize: bool = False):
    """Compile (if needed) and import the module; returns it."""
    flags = BASE_FLAGS + (SAN_FLAGS if sanitize else OPT_FLAGS)
    srcs = sources()
    if any(p.name == "beam_topk.cu" for p in srcs):
        flags = flags + ["-DEMU_HAVE_BEAM_TOPK"]
    inc = ["-I", str(ROOT / "tests" / "shim"), "-I", str(ROOT / "csrc")]
    h = hashlib.sha256(" ".join([CXX, *flags]).encode())
    for p in srcs + _headers():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    out_dir = CACHE / (("san-" if sanitize else "opt-") + h.hexdigest()[:16])
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    lib = out_dir / f"redrafter_emu{suffix}"
    if not lib.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        py_inc = ["-I", sysconfig.get_paths()["include"], "-I", pybind11.get_include()]
        objs, procs = [], []
        jobs = max(1, min(len(srcs), os.cpu_count() or 1))
        for src in srcs:
            obj = out_dir / (src.name + ".o")
            objs.append(obj)
            lang = ["-x", "c++"] if src.suffix == ".cu" else []
            extra = py_inc + ["-fvisibility=hidden"] if src.suffix == ".cpp" else []
            cmd = [CXX, *flags, *inc, *extra, *lang, "-c", str(src), "-o", str(obj)]
            procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
            while sum(p.poll() is None for _, p in procs) >= jobs:
                procs[[p.poll() is None for _, p in procs].index(True)][1].wait()
        for cmd, p in procs:
            out, _ = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"emulation build failed: {' '.join(cmd)}\n{out}")
        tmp = lib.with_suffix(".tmp")
        cmd = [CXX, *flags, "-shared", *map(str, objs), "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"emulation link failed: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        tmp.rename(lib)
    spec = importlib.util.spec_from_file_location("redrafter_emu", lib)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
