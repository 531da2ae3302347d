"""Loading a ``llama_cpp.Llama`` that runs on this CPU (see :mod:`._cpu` for why it might not).

Every ``Llama`` the backend loads (the user's GGUF, the embedded one, the forcing copy) goes through
:func:`load_llama`; :func:`check_llama` refuses one loaded elsewhere with repacking into AMX.
Without AMX kernels repacking stays on: it gives Q4_0 / Q4_K models faster interleaved kernels.
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path
from typing import Any

from esi_guard.backends._identity import check_model_path
from esi_guard.backends.llamacpp._cpu import (
    REBUILD,
    amx_kernels,
    cpu_flags,
    missing_features,
    system_features,
)
from esi_guard.backends.llamacpp._runtime import import_llama_cpp
from esi_guard.exceptions import ConfigurationError, ModelLoadError

__all__ = [
    "check_arguments",
    "check_llama",
    "llama_features",
    "load_llama",
    "open_gguf",
    "repacking_off",
]

_PATCH = threading.Lock()
"""Held while ``llama_model_default_params`` is swapped for a load without repacking."""


@cache
def llama_features() -> dict[str, str]:
    """llama.cpp's system info as ``{name: value}`` (what its CPU kernels were built for)."""
    llama_cpp = import_llama_cpp()
    return system_features(llama_cpp.llama_print_system_info())


def repacking_off() -> bool:
    """Whether models load without weight repacking here: llama.cpp has AMX kernels."""
    return amx_kernels(llama_features())


def check_build() -> None:
    """Raise :class:`ModelLoadError` if llama.cpp was built for instructions this CPU lacks."""
    missing = missing_features(llama_features(), cpu_flags())
    if missing:
        msg = (
            f"llama-cpp-python was built for {', '.join(missing)}, which this CPU lacks (a "
            "wheel built on another machine): the first decode would die with 'Illegal "
            f"instruction'; rebuild it here: {REBUILD}"
        )
        raise ModelLoadError(msg)


def load_llama(model_path: str | Path, **kwargs: Any) -> Any:
    """A ``llama_cpp.Llama`` on ``model_path`` that is safe to decode on this CPU.

    As ``llama_cpp.Llama(model_path=str(model_path), **kwargs)``, but where llama.cpp has AMX
    kernels (``AMX_INT8 = 1``) the weights load without repacking (repacked, they can crash the
    first decode); a build for instructions this CPU lacks raises
    :class:`~esi_guard.exceptions.ModelLoadError` (before 'Illegal instruction' kills the process).

    Args:
        model_path: The ``.gguf`` file.
        **kwargs: ``llama_cpp.Llama``'s other arguments (``n_ctx``, ``n_threads``, ...).
    """
    llama_cpp = import_llama_cpp()
    check_build()
    if not repacking_off():
        return llama_cpp.Llama(model_path=str(model_path), **kwargs)
    # llama-cpp-python takes no argument for it: Llama.__init__ reads the model parameters
    # from llama_model_default_params() once, which is swapped for the load.
    module = llama_cpp.llama_cpp
    with _PATCH:
        default = module.llama_model_default_params

        def no_repacking() -> Any:
            params = default()
            params.use_extra_bufts = False
            return params

        module.llama_model_default_params = no_repacking
        try:
            llama = llama_cpp.Llama(model_path=str(model_path), **kwargs)
        finally:
            module.llama_model_default_params = default
    if llama.model_params.use_extra_bufts:
        llama.close()
        msg = (
            f"could not load {str(model_path)!r} without weight repacking on this "
            f"llama-cpp-python ({getattr(llama_cpp, '__version__', '?')}); rebuild it without "
            f"AMX: {REBUILD}"
        )
        raise ModelLoadError(msg)
    return llama


def check_llama(llama: Any) -> None:
    """Refuse a ``Llama`` whose weights llama.cpp repacked for its AMX kernels.

    Raises:
        ConfigurationError: Its first decode could crash; the message says how to load it safely.
    """
    if repacking_off() and bool(llama.model_params.use_extra_bufts):
        msg = (
            "this llama_cpp.Llama was loaded with weight repacking, and this llama.cpp has AMX "
            "kernels (AMX_INT8 = 1), whose repacked weights can crash the first decode on this "
            "CPU; load it with esi_guard.backends.load_llama(path, ...) instead (repacking off)"
        )
        raise ConfigurationError(msg)


def check_arguments(llama: Any, n_seq_max: int, n_ctx: int | None = None) -> None:
    """Refuse what :class:`~.backend.LlamaCppBackend` cannot run on, naming it.

    Raises:
        ConfigurationError: ``llama`` is not a ``llama_cpp.Llama`` (or :func:`check_llama`
            refuses it), ``n_seq_max < 1`` or ``n_ctx < 2``.
    """
    if not isinstance(llama, import_llama_cpp().Llama):
        msg = f"LlamaCppBackend takes a llama_cpp.Llama, got {type(llama).__name__}"
        raise ConfigurationError(msg)
    check_llama(llama)
    if n_seq_max < 1:
        msg = f"n_seq_max must be >= 1, got {n_seq_max}"
        raise ConfigurationError(msg)
    if n_ctx is not None and n_ctx < 2:
        msg = f"n_ctx must be >= 2, got {n_ctx}"
        raise ConfigurationError(msg)


def open_gguf(
    path: str | Path, *, n_threads: int | None, n_gpu_layers: int, **llama_kwargs: Any
) -> Any:
    """The ``Llama`` that :meth:`~.backend.LlamaCppBackend.from_path` loads from ``path``.

    Its own context is small (the backend decodes on one of its own); a file missing or that
    llama.cpp cannot load is a :class:`ModelLoadError`.
    """
    check_model_path(str(path))
    where = Path(path).expanduser()
    if not where.is_file():
        msg = f"model file not found: {where} (a folder; llama.cpp loads a .gguf file)"
        raise ModelLoadError(msg)
    llama_kwargs.setdefault("verbose", False)
    try:
        llama = load_llama(
            where,
            n_ctx=512,  # the Llama's own context, which the backend does not use
            n_threads=n_threads,
            n_threads_batch=n_threads,
            n_gpu_layers=n_gpu_layers,
            **llama_kwargs,
        )
    except (ValueError, RuntimeError) as exc:
        msg = f"llama.cpp could not load {str(where)!r}: {exc}"
        raise ModelLoadError(msg) from exc
    return llama
