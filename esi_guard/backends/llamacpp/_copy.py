"""A float copy of a quantized GGUF for teacher forcing (``forcing_precision="f16"``/``"f32"``).

llama.cpp's quantized CPU kernels suit one-token generation, where reading weights is the cost;
forcing decodes hundreds of tokens at once, where its float kernels are about twice as fast
(``python -m benchmarks.timing kernels``). float32 holds a quantized block exactly; float16 moves
the top-k logits far less than the quantized kernels' own rounding does. The copy is written once
by ``llama_model_quantize`` and kept in the cache folder under the source's digest and precision.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from esi_guard.backends._identity import cache_dir, file_sha256
from esi_guard.backends.llamacpp._loading import load_llama
from esi_guard.exceptions import ConfigurationError, ModelLoadError

__all__ = [
    "COPY_LIMIT",
    "FLOAT_FILES",
    "PRECISIONS",
    "cache_dir",
    "check_precision",
    "file_precision",
    "forcing_copy",
    "forcing_llama",
    "load_forcing_copy",
    "resolve_precision",
]

PRECISIONS = ("auto", "model", "f16", "f32")
"""What ``forcing_precision`` takes."""


def check_precision(forcing_precision: str) -> None:
    """A :class:`ConfigurationError` unless ``forcing_precision`` is one of :data:`PRECISIONS`."""
    if forcing_precision not in PRECISIONS:
        msg = (
            f"forcing_precision must be 'auto', 'model', 'f16' or 'f32', got {forcing_precision!r}"
        )
        raise ConfigurationError(msg)


COPY_LIMIT = 2 << 30
"""``forcing_precision="auto"`` makes a float16 copy up to this many bytes (2 GiB)."""

FLOAT_FILES = {0: "f32", 1: "f16", 32: "bf16"}
"""GGUF ``general.file_type`` values of unquantized files, and their precision."""


def resolve_precision(asked: str, llama: Any, llama_cpp: Any) -> str:
    """``asked``, with ``"auto"`` resolved: ``"f16"`` for a small quantized model on the CPU."""
    if asked != "auto":
        return asked
    # a float file is forced as it is (a float16 copy lacks bfloat16's range)
    quantized = file_precision(llama) is None
    on_cpu = int(llama.model_params.n_gpu_layers) == 0
    size = 2 * int(llama_cpp.llama_model_n_params(llama._model.model))  # float16: 2 bytes
    return "f16" if quantized and on_cpu and size <= COPY_LIMIT else "model"


def file_precision(llama: Any) -> str | None:
    """``"f32"``, ``"f16"`` or ``"bf16"`` for a float GGUF, None for a quantized one."""
    return FLOAT_FILES.get(int(llama.metadata.get("general.file_type", 0)))


def forcing_llama(llama_cpp: Any, llama: Any, precision: str, n_threads: int | None) -> Any:
    """The ``Llama`` forcing runs on in ``precision``, a loaded copy; None: ``llama`` itself."""
    if precision not in ("f16", "f32") or precision == file_precision(llama):
        return None
    digest = file_sha256(llama.model_path)
    if digest is None:
        msg = f"cannot read {llama.model_path!r} to make its {precision} copy"
        raise ModelLoadError(msg)
    return load_forcing_copy(llama_cpp, llama, digest, precision, n_threads)


def load_forcing_copy(
    llama_cpp: Any, llama: Any, digest: str, precision: str, n_threads: int | None
) -> Any:
    """A ``llama_cpp.Llama`` on the ``precision`` copy of ``llama``'s file (sha256 ``digest``)."""
    copy = forcing_copy(llama_cpp, llama.model_path, digest, precision, n_threads)
    try:
        twin = load_llama(
            copy, n_ctx=256, verbose=False,
            n_threads=n_threads or int(llama.context_params.n_threads),
            n_threads_batch=n_threads or int(llama.context_params.n_threads_batch),
            n_gpu_layers=int(llama.model_params.n_gpu_layers),
        )  # fmt: skip
    except (ValueError, RuntimeError) as exc:
        msg = f"llama.cpp could not load the {precision} copy {str(copy)!r}: {exc} (delete it)"
        raise ModelLoadError(msg) from exc
    if twin.n_vocab() != llama.n_vocab():
        twin.close()
        msg = f"the {precision} copy {str(copy)!r} has another vocabulary than its model"
        raise ModelLoadError(msg)
    return twin


def forcing_copy(
    llama_cpp: Any, source: str | Path, digest: str, precision: str, n_threads: int | None = None
) -> Path:
    """The ``precision`` (``"f16"`` or ``"f32"``) copy of ``source`` (sha256 ``digest``).

    Written on first use (``n_threads`` None: up to 4 cores) under a temporary name, then renamed,
    so a copy cut short or made by two processes at once is never taken for a whole one.
    """
    ftypes = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "f32": llama_cpp.LLAMA_FTYPE_ALL_F32}
    if precision not in ftypes:
        msg = f"no forcing copy in precision {precision!r} (one of {sorted(ftypes)})"
        raise ValueError(msg)
    target = cache_dir() / "forcing" / f"{digest[:24]}-{precision}.gguf"
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot make the cache folder {target.parent} for the {precision} copy: {exc}"
        raise ModelLoadError(msg) from exc
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftypes[precision]
    params.allow_requantize = True
    params.nthread = n_threads or max(1, min(os.cpu_count() or 1, 4))
    from llama_cpp._utils import suppress_stdout_stderr

    with suppress_stdout_stderr(disable=False):
        code = llama_cpp.llama_model_quantize(
            str(source).encode(), str(partial).encode(), ctypes.byref(params)
        )
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        msg = (
            f"llama.cpp could not write a {precision} copy of {str(source)!r} to "
            f"{partial.parent} (code {code}); forcing_precision='model' forces on the file's "
            "own weights"
        )
        raise ModelLoadError(msg)
    os.replace(partial, target)
    return target
