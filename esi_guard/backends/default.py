"""The embedded default model as a backend that loads on first use, once per process.

``ESIGuard(threshold=...)`` with no model uses it, so ``prompt | ESIGuard(threshold=0.3)``
runs as written. It is for trying the guard: a 135M model that is wrong on most
questions. Guards built without a model share one loaded copy; it loads the first time
one of them answers, under a lock, so threads that ask at once wait for the same load.

It runs through llama.cpp in process (:class:`LlamaCppBackend`) when llama-cpp-python is
installed (the ``demo`` extra installs it), else through transformers. llama.cpp loads
the file in 0.5 s against 33 s and answers a plain question ~4x faster; it forces the
variants on a float16 copy of the weights (``forcing_precision="auto"``, engine
``llamacpp-f16``), whose forcing pass is faster than transformers' float32 one on this
project's CPU (``benchmarks/forcing_precision.py``; docs/backends.md has the table).
The two engines give the same scores to within 0.005 on
average where their greedy answers match (Spearman 0.99).
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Generator, Sequence

from esi_guard.backends._identity import file_sha256
from esi_guard.backends.base import (
    Backend,
    Forced,
    ForcingRequest,
    Generation,
    HiddenSpec,
    Messages,
)
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID, embedded_gguf
from esi_guard.exceptions import BackendError

__all__ = ["EmbeddedBackend", "embedded_backend"]

_LOCK = threading.Lock()
_LOADED: list[Backend] = []
_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
"""llama-cpp-python is installed (looked up, not imported)."""


def embedded_backend() -> Backend:
    """The process's one loaded copy of the embedded model (loaded now if need be)."""
    with _LOCK:
        if not _LOADED:
            if _LLAMA_CPP:
                from esi_guard.backends.llamacpp import LlamaCppBackend

                _LOADED.append(LlamaCppBackend.default())
            else:
                from esi_guard.backends.hf import HFBackend

                _LOADED.append(HFBackend.default())
        return _LOADED[0]


class EmbeddedBackend(Backend):
    """The embedded SmolLM2-135M-Instruct, loaded on first use and shared (see the module)."""

    provider = "llamacpp" if _LLAMA_CPP else "huggingface"
    values_kind = "logits"

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
        """``llamacpp-f16`` (the embedded model forces on its float16 copy) or ``transformers``.

        Known without loading the model.
        """
        return _LOADED[0].engine if _LOADED else ("llamacpp-f16" if _LLAMA_CPP else "transformers")

    @property
    def hidden_layers(self) -> tuple[int, ...] | None:
        """See :attr:`Backend.hidden_layers` (loads the model)."""
        return self.loaded.hidden_layers

    @property
    def hidden_size(self) -> int | None:
        """See :attr:`Backend.hidden_size` (loads the model)."""
        return self.loaded.hidden_size

    def check_hidden(self, spec: HiddenSpec | None) -> None:
        """See :meth:`Backend.check_hidden` (loads the model when ``spec`` is given)."""
        if spec is not None:
            self.loaded.check_hidden(spec)

    @property
    def loaded(self) -> Backend:
        """The shared loaded backend (loads it on first access)."""
        return embedded_backend()

    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Sequence[Generation | BackendError]:
        """See :meth:`Backend.generate`."""
        extra = {} if hidden is None else {"hidden": hidden}
        return self.loaded.generate(
            prompts, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )

    def stream_generate(
        self,
        prompt: Messages,
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Generator[str | Generation | BackendError, None, None]:
        """See :meth:`Backend.stream_generate`."""
        extra = {} if hidden is None else {"hidden": hidden}
        return self.loaded.stream_generate(
            prompt, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """See :meth:`Backend.teacher_force`."""
        return self.loaded.teacher_force(requests, top_k=top_k)

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """See :meth:`Backend.encode_answer`."""
        return self.loaded.encode_answer(prompt, answer)

    def __repr__(self) -> str:
        state = "loaded" if _LOADED else "not loaded yet"
        return f"EmbeddedBackend({EMBEDDED_MODEL_ID!r}, {state})"
