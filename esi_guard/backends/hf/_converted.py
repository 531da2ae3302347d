"""transformers' reading of a GGUF file, kept: the next load of the same file in a second.

transformers dequantizes a GGUF file's weights in Python on every load: the embedded
98 MB file takes about 30 s of one core on this project's 2-core Xeon, and every process
that loads it pays that again (each CLI run, each test worker, each server replica). The
first load keeps what it read (``save_pretrained``: safetensors weights, the config, the
tokenizer with its chat template) in the cache folder, under the file's sha256 and the
dtype asked for; the next loads read that folder instead (0.2 s for the embedded model,
the same logits bit for bit: ``tests/integration/test_embedded_model.py``).

A folder is written under a temporary name and renamed, so one cut short is never taken
for a whole one and two processes writing it at once both end with a whole one. The kept
folders together stay under :data:`CONVERTED_LIMIT` bytes: the least recently used go
first, and a model larger than the limit is not kept. Keeping is best effort: a full or
read-only disk costs the next load its 30 s, never this one its model.
``HFBackend.from_pretrained(..., keep_converted=False)`` neither reads nor writes it.
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
"""Bytes the kept folders may take together (8 GiB: the embedded model's is 0.5 GB, a 1.5B
model's in float32 6 GB)."""

_DONE = "esi_guard-converted"
"""A file written last in a kept folder: a folder without it is not whole."""


def kept_folder(digest: str, dtype: Any) -> Path:
    """Where the reading of the GGUF file with sha256 ``digest`` in ``dtype`` is kept."""
    name = str(dtype).removeprefix("torch.")
    return cache_dir() / "converted" / f"{digest[:24]}-{name}"


def read_kept(folder: Path, dtype: Any) -> tuple[Any, Any] | None:
    """The kept ``(tokenizer, model)`` in ``folder``; None when there is none.

    An unreadable one is removed (None too: the caller reads the GGUF file again).
    """
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
