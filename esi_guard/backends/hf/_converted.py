"""transformers' reading of a GGUF file, kept: the next load of the same file in a second.

transformers dequantizes a GGUF in Python on every load (~30 s for the embedded file). The first
load saves what it read in the cache folder, keyed by sha256 and dtype, written under a temporary
name and renamed; later loads read it instead, with the same logits. Kept folders stay under
:data:`CONVERTED_LIMIT` (least recently used dropped first). Best effort: a full or read-only disk
costs the next load its time, never this one its model. ``keep_converted=False`` turns it off.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from esi_guard.backends._identity import cache_dir

__all__ = ["CONVERTED_LIMIT", "keep", "kept_folder", "read_kept"]

CONVERTED_LIMIT = 8 << 30
"""Bytes the kept folders may take together (8 GiB: a 1.5B model in float32 takes 6 GB)."""

_DONE = "esi_guard-converted"
"""A file written last in a kept folder: a folder without it is not whole."""


def kept_folder(digest: str, dtype: Any) -> Path:
    """Where the reading of the GGUF file with sha256 ``digest`` in ``dtype`` is kept."""
    name = str(dtype).removeprefix("torch.")
    return cache_dir() / "converted" / f"{digest[:24]}-{name}"


def read_kept(folder: Path, dtype: Any) -> tuple[Any, Any] | None:
    """The kept ``(tokenizer, model)`` in ``folder``, else None (an unreadable one is removed)."""
    if not (folder / _DONE).is_file():
        return None
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    except (OSError, ValueError, RuntimeError, KeyError):
        shutil.rmtree(folder, ignore_errors=True)
        return None
    os.utime(folder)  # recently used: dropped last
    return tokenizer, model


def keep(folder: Path, tokenizer: Any, model: Any) -> None:
    """Keep ``model`` and ``tokenizer`` (just read from a GGUF file) in ``folder``."""
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    if size > CONVERTED_LIMIT or folder.is_dir():
        return
    partial = folder.with_name(f"{folder.name}.{os.getpid()}.partial")
    quantizer, config = getattr(model, "hf_quantizer", None), model.config
    had_quantization = hasattr(config, "quantization_config")
    quantization = getattr(config, "quantization_config", None)
    try:
        _make_room(folder.parent, size)
        # a GGUF's weights arrive dequantized: saved as the plain tensors they now are
        model.hf_quantizer = None
        if had_quantization:
            del config.quantization_config
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / _DONE).write_text(f"{time.time()}\n")
        os.rename(partial, folder)
    except (OSError, AttributeError, TypeError, ValueError, RuntimeError):
        pass  # kept by another process first; a full or read-only disk; a custom tokenizer
    finally:
        model.hf_quantizer = quantizer
        if had_quantization:
            config.quantization_config = quantization
        shutil.rmtree(partial, ignore_errors=True)


def _make_room(root: Path, size: int) -> None:
    """Drop the least recently used kept folders until ``size`` more bytes fit the limit."""
    root.mkdir(parents=True, exist_ok=True)
    kept = [(p.stat().st_mtime, _bytes(p), p) for p in root.iterdir() if (p / _DONE).is_file()]
    total = sum(b for _, b, _ in kept)
    for _, taken, path in sorted(kept):
        if total + size <= CONVERTED_LIMIT:
            break
        shutil.rmtree(path, ignore_errors=True)
        total -= taken


def _bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
