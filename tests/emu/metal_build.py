"""Build (once per source hash) and load the Metal emulation test module ``redrafter_metal_emu``.

Every ``csrc/metal/*.metal`` (and the negative controls, tests/emu/metal_negative.metal) is
rewritten by :func:`rewrite` into C++ over the host shim (tests/shim/metal_shim.h), compiled with
g++ and linked with the pybind11 bindings (tests/emu/metal_module.cpp). The rewritten sources,
objects and the module are cached under tests/.emu_build/metal/, keyed by a hash of the sources,
the shim and the flags (tests/emu/cxx_build.py, shared with emu_build.py for the CUDA kernels).

The rewrite (the MSL subset it accepts is listed in tests/shim/metal_shim.h):
- ``#include <metal_stdlib>`` -> ``#include "metal_shim.h"``;
- ``[[kernel]] void f(params) {`` -> ``void f(const ::mtl_emu::Bindings& __b) {`` followed by one
  local per parameter: ``[[buffer(k)]]`` parameters bind buffer k of the dispatch, position
  attributes read the emulated thread's position; a non-template kernel also registers itself
  under its name (template instantiations register through ``instantiate_kernel``);
- ``threadgroup T name[N];`` -> a reference to per-threadgroup storage (garbage-filled);
- any other ``[[...]]`` attribute is removed.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

from .cxx_build import CXX, build_module, cached_object, python_includes

ROOT = Path(__file__).resolve().parents[2]
METAL = ROOT / "csrc" / "metal"
CACHE = ROOT / "tests" / ".emu_build" / "metal"
FLAGS = ["-std=c++20", "-fPIC", "-DREDRAFTER_EMULATE", "-DREDRAFTER_METAL_EMULATE", "-Wall", "-Wextra", "-Werror",
         "-Wno-unused-parameter", "-Wno-unknown-pragmas", "-Wno-unused-variable", "-O2", "-g0"]
BUILTINS = {
    "thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "threadgroups_per_grid", "thread_index_in_simdgroup",
    "simdgroup_index_in_threadgroup", "threads_per_simdgroup", "simdgroups_per_threadgroup",
}


def kernel_sources() -> list[Path]:
    return sorted(METAL.glob("*.metal")) + [ROOT / "tests" / "emu" / "metal_negative.metal"]


def _split_params(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur)
    return [p.strip() for p in out]


_KERNEL = re.compile(r"\[\[\s*kernel\s*\]\]\s*void\s+(\w+)\s*\(")
_PARAM = re.compile(r"^(?P<decl>.*?)\s*(?P<name>\w+)\s*\[\[\s*(?P<attr>\w+)\s*(?:\(\s*(?P<arg>\d+)\s*\))?\s*\]\]$", re.S)
_TG_DECL = re.compile(r"^(?P<ind>[ \t]*)threadgroup\s+(?P<type>[\w:<> ]+?)\s+(?P<name>\w+)\s*(?P<dims>(?:\[[^\]]+\])*)\s*;",
                      re.M)


def _rewrite_kernel(src: str, m: re.Match, path: Path) -> tuple[str, int]:
    """Rewrites the kernel whose signature starts at m; returns the new source and where to resume."""
    name = m.group(1)
    depth, i = 1, m.end()
    while depth:
        depth += {"(": 1, ")": -1}.get(src[i], 0)
        i += 1
    params = _split_params(src[m.end(): i - 1])
    j = src.index("{", i)
    if src[i:j].strip():
        raise ValueError(f"{path.name}: unexpected text between the parameters of {name} and its body")
    locals_, buffers = [], []
    for p in params:
        pm = _PARAM.match(" ".join(p.split()))
        if not pm:
            raise ValueError(f"{path.name}: kernel {name}: parameter without a supported attribute: {p!r}")
        decl, pname, attr, arg = pm["decl"], pm["name"], pm["attr"], pm["arg"]
        if attr == "buffer":
            buffers.append(arg)
            locals_.append(f"{decl} {pname} = ::mtl_emu::bind<{decl}>(__b, {arg});")
        elif attr in BUILTINS:
            if decl.strip() not in ("uint", "const uint", "ushort", "int"):
                raise ValueError(f"{path.name}: kernel {name}: {attr} must be a scalar (uint)")
            locals_.append(f"const {decl.replace('const ', '')} {pname} = ::mtl_emu::{attr}<{decl.replace('const ', '')}>();")
        else:
            raise ValueError(f"{path.name}: kernel {name}: unsupported parameter attribute [[{attr}]]")
    head = src[: m.start()].rstrip()
    is_template = head.endswith(">")
    sig = f"void {name}(const ::mtl_emu::Bindings& __b)"
    # the buffer indices the kernel reads (a dispatch that leaves one unbound fails before launch),
    # declared before the kernel's template header if it has one
    table = f"inline constexpr int {name}__buffers[] = {{{', '.join(buffers + ['-1'])}}}; "
    at = head.rindex("template") if is_template else m.start()
    new = ""
    if not is_template:
        new += f"{sig}; static ::mtl_emu::Registrar {name}__registrar(\"{name}\", &{name}, {name}__buffers); "
    # the locals stay on the signature's line so that line numbers (barrier diagnostics) match
    new += sig + " { " + " ".join(locals_) + "\n" * src[m.start(): j].count("\n")
    out = src[:at] + table + src[at: m.start()] + new
    return out + src[j + 1:], len(out)


def rewrite(src: str, path: Path) -> str:
    """MSL subset -> C++ over tests/shim/metal_shim.h (line numbers preserved)."""
    src = re.sub(r"#include\s*<metal_stdlib>", '#include "metal_shim.h"', src)
    pos = 0
    while (m := _KERNEL.search(src, pos)) is not None:
        src, pos = _rewrite_kernel(src, m, path)

    def tg(m: re.Match) -> str:
        t, dims = m["type"].strip(), m["dims"].replace(" ", "")
        return (f"{m['ind']}auto& {m['name']} = ::mtl_emu::tg_var<{t}{dims}>(__FILE__, __LINE__);")

    src = _TG_DECL.sub(tg, src)
    src = re.sub(r"\[\[[^\[\]]*\]\]", "", src)  # remaining attributes ([[host_name]] etc.)
    return src


def _stage() -> tuple[Path, list[Path], bytes]:
    """Rewritten copies of csrc/metal/* under the cache; returns (dir, rewritten kernels, digest)."""
    h = hashlib.sha256()
    files = sorted(METAL.glob("*.h")) + kernel_sources() + sorted((ROOT / "tests" / "shim").glob("*.h"))
    for p in files + [Path(__file__)]:
        h.update(p.name.encode() + p.read_bytes())
    digest = h.digest()
    stage = CACHE / f"src-{digest.hex()[:16]}"
    outs = []
    if not stage.exists():
        tmp = stage.with_suffix(".tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        for p in sorted(METAL.glob("*.h")) + kernel_sources():
            text = p.read_text()
            if p.suffix == ".metal" or p.name == "common.h":
                text = rewrite(text, p)
            (tmp / (p.name if p.suffix == ".h" else p.stem + ".metal.cpp")).write_text(
                f'#line 1 "{p.relative_to(ROOT)}"\n' + text)
        tmp.rename(stage)
    outs = [stage / (p.stem + ".metal.cpp") for p in kernel_sources()]
    return stage, outs, digest


def compile_one(path: Path) -> subprocess.CompletedProcess:
    """Compile one .metal through the shim (syntax check, no object kept)."""
    stage, _, _ = _stage()
    src = stage / (path.stem + ".metal.cpp")
    cmd = [CXX, *FLAGS, "-I", str(stage), "-I", str(ROOT / "tests" / "shim"), "-x", "c++", "-fsyntax-only", str(src)]
    return subprocess.run(cmd, capture_output=True, text=True)


# Just enough of metal-cpp's <Metal/Metal.hpp> for MLX's metal headers to parse: dispatch.cpp is
# then syntax-checked against the installed MLX headers (it cannot be compiled for real here).
METAL_HPP_STUB = """#pragma once
#include <cstddef>
#include <cstdint>
namespace NS {
using UInteger = unsigned long;
template <class T> class SharedPtr { public: T* get() const { return p; } T* operator->() const { return p; }
 private: T* p = nullptr; };
class AutoreleasePool;
class Error;
class String;
}
namespace MTL {
struct Size { Size(NS::UInteger, NS::UInteger, NS::UInteger) {} };
enum class DataType { None };
class Allocation {};
class Resource : public Allocation {};
class Buffer : public Resource {};
class Library {};
class Function {};
class LinkedFunctions {};
class Fence {};
class Device {};
class CommandQueue {};
class CommandBuffer {};
class ResidencySet {};
class ComputePipelineState { public: NS::UInteger maxTotalThreadsPerThreadgroup() const; };
class ComputeCommandEncoder { public: void setComputePipelineState(ComputePipelineState*);
  void setBytes(const void*, NS::UInteger, NS::UInteger); void setThreadgroupMemoryLength(NS::UInteger, NS::UInteger); };
}
"""


def check_dispatch_syntax() -> subprocess.CompletedProcess:
    """g++ -fsyntax-only of csrc/metal/dispatch.cpp against MLX's headers and a metal-cpp stub."""
    import mlx  # the installed MLX provides the headers

    stub = CACHE / "metal_cpp_stub" / "Metal"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "Metal.hpp").write_text(METAL_HPP_STUB)
    inc = Path(mlx.__path__[0]) / "include"
    cmd = [CXX, "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter",
           "-isystem", str(stub.parent), "-isystem", str(inc), "-I", str(ROOT / "csrc"), str(METAL / "dispatch.cpp")]
    return subprocess.run(cmd, capture_output=True, text=True)


def build():
    """Compile what is missing, link, import; returns the module."""
    stage, srcs, digest = _stage()
    inc = ["-I", str(stage), "-I", str(ROOT / "tests" / "shim"), "-I", str(ROOT / "csrc")]
    cmds = [cached_object([CXX, *FLAGS, *inc, "-x", "c++", "-c", str(src)], CACHE, src, digest) for src in srcs]
    mod_src = ROOT / "tests" / "emu" / "metal_module.cpp"
    cmd = [CXX, *FLAGS, *inc, *python_includes(), "-c", str(mod_src)]
    cmds.append(cached_object(cmd, CACHE, mod_src, digest, mod_src.read_bytes()))
    return build_module("redrafter_metal_emu", CACHE, "mod", cmds, ["-O2"], "metal emulation")
