"""Training corpus of the tiny model: the CPython standard library of the running interpreter.

Deterministic: files are sorted by relative path and split whole into train / val / heldout by a
hash of that path (~94 / 3 / 3 %). ``heldout`` files are never trained on; they supply the
demo and benchmark prompts (:func:`load_prompts`), which is why this module is outside ``train/``.
No corpus text is stored in the repository: it is rebuilt from the interpreter's own ``Lib/``
directory each time.
"""

from __future__ import annotations

import hashlib
import random
import re
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

__all__ = [
    "CorpusFile",
    "EOS_TOKEN",
    "SPLITS",
    "corpus_files",
    "iter_texts",
    "load_prompts",
    "split_of",
    "stdlib_root",
]

EOS_TOKEN = "<|endoftext|>"
SPLITS = ("train", "val", "heldout")

# directory names excluded anywhere in the relative path
_EXCLUDED_DIRS = {
    "site-packages",
    "dist-packages",
    "test",
    "tests",
    "idle_test",
    "idlelib",
    "__pycache__",
    "pydoc_data",  # one 750 kB file of help text
    "ensurepip",
    "lib-dynload",
    "turtledemo",
}
# generated charmap tables in encodings/ (cp437.py, mac_roman.py, ...) are mostly hex literals
_ENCODINGS_KEEP = {"__init__.py", "aliases.py", "utf_8.py", "utf_16.py", "utf_32.py", "idna.py", "punycode.py"}
_MAX_FILE_BYTES = 300_000


@dataclass(frozen=True)
class CorpusFile:
    rel: str  # path relative to the stdlib root, with "/" separators
    path: Path
    split: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def split_of(rel: str) -> str:
    """Split of a file from a hash of its relative path: ~94 % train, 3 % val, 3 % heldout."""
    h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little") % 1000
    if h < 940:
        return "train"
    if h < 970:
        return "val"
    return "heldout"


def _keep(rel_parts: tuple[str, ...]) -> bool:
    if any(p in _EXCLUDED_DIRS or p.startswith("config-") for p in rel_parts[:-1]):
        return False
    name = rel_parts[-1]
    if name.startswith("_sysconfigdata") or name.startswith("test_"):
        return False
    if rel_parts[0] == "encodings" and name not in _ENCODINGS_KEEP:
        return False
    return True


@lru_cache(maxsize=4)
def _all_files(root: str) -> tuple[CorpusFile, ...]:
    base = Path(root)
    out = []
    for p in base.rglob("*.py"):
        rel_parts = p.relative_to(base).parts
        if not _keep(rel_parts):
            continue
        if not p.is_file() or p.stat().st_size > _MAX_FILE_BYTES or p.stat().st_size == 0:
            continue
        rel = "/".join(rel_parts)
        out.append(CorpusFile(rel, p, split_of(rel)))
    out.sort(key=lambda f: f.rel)
    return tuple(out)


def corpus_files(split: str | None = None, root: str | Path | None = None) -> list[CorpusFile]:
    """Sorted corpus files, optionally of one split."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    files = _all_files(str(Path(root).resolve() if root else stdlib_root()))
    return [f for f in files if split is None or f.split == split]


def read_text(f: CorpusFile) -> str:
    return f.path.read_text(encoding="utf-8", errors="replace")


def iter_texts(split: str, root: str | Path | None = None, limit_files: int | None = None) -> Iterator[str]:
    """Texts of one split in sorted order (``limit_files`` keeps only the first few, for tests)."""
    files = corpus_files(split, root)
    if limit_files is not None:
        files = files[:limit_files]
    for f in files:
        yield read_text(f)


_DEF_RE = re.compile(r"^[ \t]*(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(", re.MULTILINE)


def prompt_candidates(text: str, chars: int) -> list[str]:
    """Prompts ending inside a ``def``: the def line, its docstring, and the start of its body.

    Each prompt is the ``chars`` characters starting at a ``def`` line, cut back to the end of a
    line so that the continuation starts at a fresh line.
    """
    out = []
    for m in _DEF_RE.finditer(text):
        start = m.start()
        chunk = text[start : start + chars]
        if len(chunk) < chars:
            continue
        cut = chunk.rfind("\n")
        if cut < chars // 2:
            continue
        out.append(chunk[: cut + 1])
    return out


def load_prompts(n: int, chars: int = 200, seed: int = 0, split: str = "heldout", root: str | Path | None = None) -> list[str]:
    """``n`` deterministic prompts (strings) from ``split`` files (heldout by default).

    Each prompt begins at a function definition and spans up to ``chars`` characters, ending at
    a line break. Draws are without replacement and deterministic in ``seed``; when the split
    has fewer than ``n`` candidates it cycles through them.
    """
    if n <= 0:
        return []
    cands: list[str] = []
    for f in corpus_files(split, root):
        cands.extend(prompt_candidates(read_text(f), chars))
    if not cands:
        raise RuntimeError(f"load_prompts: no prompt candidates in split {split!r}")
    rng = random.Random(seed)
    order = list(range(len(cands)))
    rng.shuffle(order)
    return [cands[order[i % len(order)]] for i in range(n)]


def main() -> None:  # corpus statistics: python -m redrafter_ext.corpus
    root = stdlib_root()
    print(f"stdlib: {root}")
    for split in SPLITS:
        files = corpus_files(split)
        size = sum(f.path.stat().st_size for f in files)
        print(f"{split:8s} {len(files):5d} files {size / 1e6:8.2f} MB")
    for p in load_prompts(2, 200, 0):
        print("-" * 40)
        print(p)


if __name__ == "__main__":
    main()
