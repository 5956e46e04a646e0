"""Compile, cache, link and import a test extension module built with g++ (shared by the emulations).

emu_build.py (CUDA kernels over the host shim) and metal_build.py (rewritten Metal kernels) each
list their compile commands; objects and modules are cached by a hash of everything that goes into
them, so a rebuild compiles only what changed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sysconfig
from pathlib import Path
from types import ModuleType

import pybind11

CXX = os.environ.get("CXX", "g++")


def python_includes() -> list[str]:
    """Flags for compiling pybind11 bindings (hidden visibility, as pybind11 recommends)."""
    return ["-I", sysconfig.get_paths()["include"], "-I", pybind11.get_include(), "-fvisibility=hidden"]


def cached_object(cmd: list[str], cache: Path, src: Path, *inputs: bytes) -> tuple[list[str], Path]:
    """(cmd, object path) with the object keyed by the command and ``inputs`` (source, header bytes)."""
    key = hashlib.sha256(" ".join(cmd).encode() + b"".join(inputs)).hexdigest()[:16]
    return cmd, cache / "obj" / f"{src.name}.{key}.o"


def _compile_missing(cmds: list[tuple[list[str], Path]], what: str) -> None:
    """Runs the compile commands whose object is missing, os.cpu_count() at a time."""
    jobs = max(1, os.cpu_count() or 1)
    running: list[tuple[list[str], Path, subprocess.Popen]] = []

    def finish(entry):
        cmd, obj, p = entry
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"{what} build failed: {' '.join(cmd)}\n{out}")
        obj.with_suffix(".tmp").rename(obj)

    for cmd, obj in cmds:
        if obj.exists():
            continue
        while len(running) >= jobs:
            finish(running.pop(0))
        full = cmd + ["-o", str(obj.with_suffix(".tmp"))]
        running.append((full, obj, subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    for entry in running:
        finish(entry)


def build_module(
    name: str, cache: Path, tag: str, cmds: list[tuple[list[str], Path]], link_flags: list[str], what: str
) -> ModuleType:
    """Compile what is missing, link into ``cache/<tag>-<key>/<name><EXT_SUFFIX>``, import it.

    ``cmds`` are (command without -o, object path) pairs from :func:`cached_object`; ``what`` names
    the build in error messages.
    """
    objs = [str(o) for _, o in cmds]
    key = hashlib.sha256(" ".join([*link_flags, *objs]).encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    lib = cache / f"{tag}-{key}" / f"{name}{suffix}"
    if not lib.exists():
        (cache / "obj").mkdir(parents=True, exist_ok=True)
        _compile_missing(cmds, what)
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(".tmp")
        cmd = [CXX, *link_flags, "-shared", *objs, "-o", str(tmp)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"{what} link failed: {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        tmp.rename(lib)
    spec = importlib.util.spec_from_file_location(name, lib)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
