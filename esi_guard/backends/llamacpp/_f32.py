"""A float32 copy of a quantized GGUF, for teacher forcing (``forcing_precision="f32"``).

llama.cpp's CPU kernels for quantized weights are built for generation, one token at a
time, where reading the weights is the cost; teacher forcing runs hundreds of tokens in
one decode, where arithmetic is, and there its float32 matrix kernels are faster (on
the embedded Q4_1 model on one core: 204 forced answer tokens a second against 88). The
copy holds the same weights (a quantized block dequantizes exactly to float32), written
once by llama.cpp's own ``llama_model_quantize`` (about a second for the embedded model)
and kept in the cache folder under the source file's digest.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from esi_guard.exceptions import ModelLoadError

__all__ = ["F32_LIMIT", "cache_dir", "f32_copy", "load_f32_copy", "resolve_precision"]

F32_LIMIT = 2 << 30
"""``forcing_precision="auto"`` makes a float32 copy up to this many bytes (2 GiB)."""


def resolve_precision(asked: str, llama: Any, llama_cpp: Any) -> str:
    """``asked``, with ``"auto"`` resolved: ``"f32"`` for a small quantized model on the CPU."""
    if asked != "auto":
        return asked
    quantized = int(llama.metadata.get("general.file_type", 0)) != 0  # 0: all float32
    on_cpu = int(llama.model_params.n_gpu_layers) == 0
    size = 4 * int(llama_cpp.llama_model_n_params(llama._model.model))
    return "f32" if quantized and on_cpu and size <= F32_LIMIT else "model"


def load_f32_copy(llama_cpp: Any, llama: Any, digest: str, n_threads: int | None) -> Any:
    """A ``llama_cpp.Llama`` on the float32 copy of ``llama``'s file (sha256 ``digest``)."""
    copy = f32_copy(llama_cpp, llama.model_path, digest)
    try:
        twin = llama_cpp.Llama(
            model_path=str(copy), n_ctx=256, verbose=False,
            n_threads=n_threads or int(llama.context_params.n_threads),
            n_threads_batch=n_threads or int(llama.context_params.n_threads_batch),
            n_gpu_layers=int(llama.model_params.n_gpu_layers),
        )  # fmt: skip
    except (ValueError, RuntimeError) as exc:
        msg = f"llama.cpp could not load the float32 copy {str(copy)!r}: {exc} (delete it)"
        raise ModelLoadError(msg) from exc
    if twin.n_vocab() != llama.n_vocab():
        twin.close()
        msg = f"the float32 copy {str(copy)!r} has another vocabulary than its model"
        raise ModelLoadError(msg)
    return twin


def cache_dir() -> Path:
    """``$ESI_GUARD_CACHE``, else ``$XDG_CACHE_HOME/esi_guard``, else ``~/.cache/esi_guard``."""
    own = os.environ.get("ESI_GUARD_CACHE")
    if own:
        return Path(own).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "esi_guard"


def f32_copy(llama_cpp: Any, source: str | Path, digest: str) -> Path:
    """The float32 copy of ``source`` (sha256 ``digest``), written on first use.

    Written to a temporary name and renamed, so a copy cut short is never taken for a
    whole one and two processes making it at once both end with a whole file.
    """
    target = cache_dir() / "forcing" / f"{digest[:24]}-f32.gguf"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot make the cache folder {target.parent} for the float32 copy: {exc}"
        raise ModelLoadError(msg) from exc
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = max(1, min(os.cpu_count() or 1, 4))
    from llama_cpp._utils import suppress_stdout_stderr

    with suppress_stdout_stderr(disable=False):
        code = llama_cpp.llama_model_quantize(
            str(source).encode(), str(partial).encode(), ctypes.byref(params)
        )
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        msg = (
            f"llama.cpp could not write a float32 copy of {str(source)!r} to {partial.parent} "
            f"(code {code}); forcing_precision='model' forces on the file's own weights"
        )
        raise ModelLoadError(msg)
    os.replace(partial, target)
    return target
