"""Build (once per source hash) and load the emulation test module ``redrafter_emu``.

Every ``csrc/cuda/*.cu`` plus the negative controls (tests/emu/negative.cu) is compiled with g++
as C++ against the host shim (tests/shim), then linked with the pybind11 bindings
(tests/emu/module.cpp). Objects and modules are cached under tests/.emu_build/ (ignored by git),
keyed by a hash of the sources, the shim and the flags. ``sanitize=True`` builds the kernels with
ASan+UBSan (the pybind11 glue is shared with the plain build: it has nothing to check and is the
slowest file to compile); that module must be loaded in a process started with libasan preloaded
(see test_sanitized in tests/test_cuda_emulated.py).
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
BASE_FLAGS = ["-std=c++20", "-fPIC", "-DREDRAFTER_EMULATE", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
              "-Wno-unknown-pragmas"]
OPT_FLAGS = ["-O2", "-g0"]
SAN_FLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
INCLUDES = ["-I", str(ROOT / "tests" / "shim"), "-I", str(ROOT / "csrc")]


def kernel_sources() -> list[Path]:
    return sorted((ROOT / "csrc" / "cuda").glob("*.cu")) + [ROOT / "tests" / "emu" / "negative.cu"]


def _headers_digest() -> bytes:
    h = hashlib.sha256()
    for p in sorted((ROOT / "csrc" / "cuda").glob("*.h*")) + sorted((ROOT / "tests" / "shim").glob("*.h")):
        h.update(p.name.encode() + p.read_bytes())
    return h.digest()


def _compile_cmds(sanitize: bool) -> list[tuple[list[str], Path]]:
    """(command without -o, object path) for every object; objects are keyed by their inputs."""
    headers = _headers_digest()
    cmds = []
    srcs = kernel_sources()
    defs = ["-DEMU_HAVE_BEAM_TOPK"] if any(p.name == "beam_topk.cu" for p in srcs) else []
    for src in srcs + [ROOT / "tests" / "emu" / "module.cpp"]:
        if src.suffix == ".cu":
            cmd = [CXX, *BASE_FLAGS, *(SAN_FLAGS if sanitize else OPT_FLAGS), *INCLUDES, "-x", "c++"]
        else:  # the bindings: never sanitized, shared by both builds
            cmd = [CXX, *BASE_FLAGS, *OPT_FLAGS, *defs, *INCLUDES, "-I", sysconfig.get_paths()["include"],
                   "-I", pybind11.get_include(), "-fvisibility=hidden"]
        cmd += ["-c", str(src)]
        key = hashlib.sha256(" ".join(cmd).encode() + headers + src.read_bytes()).hexdigest()[:16]
        cmds.append((cmd, CACHE / "obj" / f"{src.name}.{key}.o"))
    return cmds


def build(sanitize: bool = False):
    """Compile what is missing, link, import; returns the module."""
    cmds = _compile_cmds(sanitize)
    link_flags = SAN_FLAGS if sanitize else OPT_FLAGS
    key = hashlib.sha256(" ".join([*link_flags, *(str(o) for _, o in cmds)]).encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    lib = CACHE / f"{'san' if sanitize else 'opt'}-{key}" / f"redrafter_emu{suffix}"
    if not lib.exists():
        (CACHE / "obj").mkdir(parents=True, exist_ok=True)
        jobs = max(1, os.cpu_count() or 1)
        running: list[tuple[list[str], Path, subprocess.Popen]] = []

        def finish(entry):
            cmd, obj, p = entry
            out, _ = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"emulation build failed: {' '.join(cmd)}\n{out}")
            obj.with_suffix(".tmp").rename(obj)

        for cmd, obj in cmds:
            if obj.exists():
                continue
            while len(running) >= jobs:
                finish(running.pop(0))
            full = cmd + ["-o", str(obj.with_suffix(".tmp"))]
            running.append((full, obj, subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                         text=True)))
        for entry in running:
            finish(entry)
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(".tmp")
        cmd = [CXX, *link_flags, "-shared", *(str(o) for _, o in cmds), "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"emulation link failed: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        tmp.rename(lib)
    spec = importlib.util.spec_from_file_location("redrafter_emu", lib)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
