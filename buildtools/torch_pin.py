"""scikit-build-core metadata provider for ``project.dependencies``: torch pinned to the release the
extension is compiled against.

The compiled torch ops link against libtorch's C++ ABI, which changes between minor releases, so a
wheel built with torch X.Y must require ``torch==X.Y.*`` (as other torch extensions do). The
version is the torch of the building interpreter (the one CMake finds: build with
``--no-build-isolation``). Without torch there (an isolated build, or REDRAFTER_TORCH=OFF) no torch
module is compiled and the ``torch`` setting's unpinned requirement is used.

Settings (``[tool.scikit-build.metadata.dependencies]`` in pyproject.toml):
    torch   the requirement when no torch module is built, e.g. ``"torch>=2.4"``
    base    the other dependencies, as in ``project.dependencies``
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from importlib import metadata
from typing import Any


def torch_requirement(fallback: str, version: str | None = None) -> str:
    """``torch==X.Y.*`` for the torch ``version`` (default: the installed one), else ``fallback``."""
    if os.environ.get("REDRAFTER_TORCH", "AUTO").upper() == "OFF":
        return fallback
    if version is None:
        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            return fallback
    release = version.split("+")[0].split(".")  # local labels (+cpu, +cu128) are not part of the pin
    if len(release) < 2 or not all(p.isdigit() for p in release[:2]):
        raise RuntimeError(f"torch_pin: cannot read a release from torch version {version!r}")
    return f"torch=={int(release[0])}.{int(release[1])}.*"


def dynamic_metadata(field: str, settings: Mapping[str, Any] | None = None) -> list[str]:
    settings = settings or {}
    if field != "dependencies":
        raise RuntimeError(f"torch_pin provides project.dependencies only, not {field!r}")
    unknown = set(settings) - {"torch", "base"}
    if unknown:
        raise RuntimeError(f"torch_pin: unknown settings {sorted(unknown)} (expected torch, base)")
    base = list(settings.get("base", []))
    return [torch_requirement(str(settings.get("torch", "torch")))] + base
