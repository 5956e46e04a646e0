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
from pathlib import Path

from .cxx_build import CXX, build_module, cached_object, python_includes

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "tests" / ".emu_build"
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
            cmd = [CXX, *BASE_FLAGS, *OPT_FLAGS, *defs, *INCLUDES, *python_includes()]
        cmds.append(cached_object(cmd + ["-c", str(src)], CACHE, src, headers, src.read_bytes()))
    return cmds


def build(sanitize: bool = False):
    """Compile what is missing, link, import; returns the module."""
    link_flags = SAN_FLAGS if sanitize else OPT_FLAGS
    return build_module("redrafter_emu", CACHE, "san" if sanitize else "opt", _compile_cmds(sanitize), link_flags,
                        "emulation")
