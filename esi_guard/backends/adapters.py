"""A backend from the model object a LangChain user already has (``ESIGuard(llm=...)``).

It shares the loaded weights (never a second copy) or, for a server's client, the same server,
model name and key. Accepted: a model id, folder, ``.gguf`` or ``"default"`` (see
:func:`local_backend`); a ``(PreTrainedModel, tokenizer)`` pair, a text-generation ``pipeline``, or
langchain-huggingface's ``HuggingFacePipeline``/``ChatHuggingFace`` around one (an inference
endpoint exposes no logits); langchain-openai's ``ChatOpenAI``/``OpenAI`` (``mode="auto"``); a
``llama_cpp.Llama`` or langchain-community's ``ChatLlamaCpp``/``LlamaCpp``. Recognised by class
and module, so none of these is imported; anything else is a :class:`ConfigurationError`.

``n_threads``: llama.cpp takes CPU threads per backend; transformers process-wide
(``torch.set_num_threads``); with a server's client or a ready :class:`Backend` they are a
:class:`ConfigurationError`.
"""

from __future__ import annotations

import importlib.util
from enum import Enum
from pathlib import Path
from typing import Any

from esi_guard.backends._identity import check_model_path
from esi_guard.backends.base import Backend
from esi_guard.exceptions import ConfigurationError

__all__ = [
    "ACCEPTED",
    "LocalBackend",
    "auto_engine",
    "backend_for",
    "check_threads",
    "local_backend",
    "read_chat_template",
    "torch_threads",
]


class LocalBackend(str, Enum):
    """What runs a local model (``--model default``, a folder, a hub id or a ``.gguf`` file)."""

    auto = "auto"
    transformers = "transformers"
    llamacpp = "llamacpp"


def read_chat_template(chat_template: str | None) -> str | None:
    """A chat template file's source (``"completion"`` and None as they are).

    Raises:
        ConfigurationError: the file cannot be read (its name and the reason).
    """
    if chat_template is None or chat_template == "completion":
        return chat_template
    try:
        return Path(chat_template).read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read the chat template {chat_template}: {exc.strerror}"
        raise ConfigurationError(msg) from exc


_REMOTE = {"langchain_openai.ChatOpenAI", "langchain_openai.OpenAI"}
"""Clients of an OpenAI-compatible server: the server runs the model."""

ACCEPTED = (
    "a model id or path (str), a (PreTrainedModel, tokenizer) pair, a transformers "
    "text-generation pipeline, langchain-huggingface HuggingFacePipeline or ChatHuggingFace, "
    "langchain-openai ChatOpenAI or OpenAI, a llama_cpp.Llama, langchain-community ChatLlamaCpp "
    "or LlamaCpp, or a Backend"
)


def _kind(value: Any) -> set[str]:
    """``module.Class`` names of the value's class and its bases."""
    return {f"{c.__module__.split('.')[0]}.{c.__name__}" for c in type(value).__mro__}


def backend_for(llm: Any, *, n_threads: int | None = None) -> Backend:
    """The backend that scores answers of ``llm`` (the module lists what it accepts; threads)."""
    from esi_guard.backends.hf import HFBackend

    kinds = _kind(llm)
    if n_threads is not None:
        check_threads(n_threads)
        if isinstance(llm, Backend) or kinds & _REMOTE:
            msg = (
                f"n_threads sets the CPU threads of a model the guard runs, not of a "
                f"{type(llm).__name__}: pass a model path, 'default' or a loaded model as "
                "llm=, or build the backend with its own threads "
                "(LlamaCppBackend.from_path(..., n_threads=N))"
            )
            raise ConfigurationError(msg)
    if isinstance(llm, Backend):
        return llm
    if isinstance(llm, str):
        return local_backend(llm, n_threads=n_threads)
    if "llama_cpp.Llama" in kinds:
        return _from_llama(llm, n_threads)
    if kinds & {"langchain_community.ChatLlamaCpp", "langchain_community.LlamaCpp"}:
        if llm.client is None:
            msg = f"the {type(llm).__name__} has no loaded model (its client is None)"
            raise ConfigurationError(msg)
        return _from_llama(llm.client, n_threads)
    if isinstance(llm, tuple) and len(llm) == 2:
        torch_threads(n_threads)
        return HFBackend(llm[0], llm[1])
    if "transformers.Pipeline" in kinds:
        return _from_pipeline(llm, n_threads)
    if "langchain_huggingface.HuggingFacePipeline" in kinds:
        return _from_pipeline(llm.pipeline, n_threads)
    if "langchain_huggingface.ChatHuggingFace" in kinds:
        inner = llm.llm
        if "langchain_huggingface.HuggingFacePipeline" not in _kind(inner):
            msg = (
                f"ChatHuggingFace around a {type(inner).__name__} cannot be guarded: an "
                "inference endpoint gives no logits; use a HuggingFacePipeline or an "
                "OpenAI-compatible server (OpenAIBackend)"
            )
            raise ConfigurationError(msg)
        return _from_pipeline(inner.pipeline, n_threads)
    if kinds & _REMOTE:
        return _from_openai(llm)
    msg = f"ESIGuard(llm=...) cannot guard a {type(llm).__module__}.{type(llm).__name__}; "
    msg += f"it takes {ACCEPTED}"
    raise ConfigurationError(msg)


def local_backend(
    model: str,
    *,
    engine: str | None = None,
    device: str | None = None,
    chat_template: str | None = None,
    dtype: str | None = None,
    n_threads: int | None = None,
) -> Backend:
    """A local model by name: ``"default"`` (the embedded one), a hub id, a folder or a ``.gguf``.

    A path-like name that is not there is a :class:`ModelLoadError` before any hub lookup.

    Args:
        model: What to load.
        engine: ``"transformers"`` (:class:`HFBackend`) or ``"llamacpp"`` (:class:`LlamaCppBackend`,
            ``"default"`` or ``.gguf`` only). None: llama.cpp for those when it is installed and no
            ``dtype`` or non-CPU ``device`` is asked, else transformers. Threshold files record the
            engine (:attr:`Backend.engine`): calibrate on the one you serve with.
        device: transformers' device (``"cpu"``, ``"cuda"``...); llama.cpp runs on the CPU.
        dtype: transformers' dtype (None: its default); llama.cpp runs the GGUF's own, refuses one.
        chat_template: Jinja source overriding the model's template, or ``"completion"`` for a base
            model (:data:`~esi_guard.backends.llamacpp.COMPLETION_TEMPLATE`).
        n_threads: CPU threads: llama.cpp's for this backend, or torch's process-wide (None: own).
    """
    from esi_guard.backends.llamacpp import COMPLETION_TEMPLATE

    if n_threads is not None:
        check_threads(n_threads)
    check_model_path(model)
    model = str(Path(model).expanduser()) if model.startswith("~") else model
    engine = engine or auto_engine(model, device=device, dtype=dtype)
    template = COMPLETION_TEMPLATE if chat_template == "completion" else chat_template
    if engine == "llamacpp":
        from esi_guard.backends.llamacpp import LlamaCppBackend

        if dtype is not None:
            msg = f"llama.cpp runs the GGUF's own types; a dtype ({dtype!r}) is for transformers"
            raise ConfigurationError(msg)
        if model == "default":
            return LlamaCppBackend.default(chat_template=template, n_threads=n_threads)
        if not model.endswith(".gguf"):
            msg = f"llama.cpp runs a .gguf file or 'default', got {model!r}"
            raise ConfigurationError(msg)
        return LlamaCppBackend.from_path(model, chat_template=template, n_threads=n_threads)
    if engine != "transformers":
        msg = f"engine must be 'transformers' or 'llamacpp', got {engine!r}"
        raise ConfigurationError(msg)
    from esi_guard.backends.hf import HFBackend

    torch_threads(n_threads)
    kwargs: dict[str, Any] = {"device": device} if device else {}
    if dtype:
        kwargs["dtype"] = dtype
    if model == "default":
        return HFBackend.default(chat_template=template, **kwargs)
    return HFBackend.from_pretrained(model, chat_template=template, **kwargs)


def auto_engine(model: str, *, device: str | None = None, dtype: str | None = None) -> str:
    """The engine :func:`local_backend` picks for ``model`` when none is named (see ``engine``)."""
    gguf = model == "default" or model.endswith(".gguf")
    transformers_only = dtype is not None or device not in (None, "cpu")
    if gguf and not transformers_only and importlib.util.find_spec("llama_cpp") is not None:
        return "llamacpp"
    return "transformers"


def _from_pipeline(pipeline: Any, n_threads: int | None) -> Backend:
    from esi_guard.backends.hf import HFBackend

    task = getattr(pipeline, "task", "text-generation")
    if task != "text-generation":
        msg = f"a transformers pipeline for {task!r} cannot be guarded; need text-generation"
        raise ConfigurationError(msg)
    torch_threads(n_threads)
    return HFBackend(pipeline.model, pipeline.tokenizer)


def _from_openai(llm: Any) -> Backend:
    from esi_guard.backends.openai import OpenAIBackend

    key: Any = getattr(llm, "openai_api_key", None)
    secret = key.get_secret_value() if hasattr(key, "get_secret_value") else key
    if secret is not None and not isinstance(secret, str):
        msg = "a ChatOpenAI whose api_key is a callable cannot be guarded; pass the key itself"
        raise ConfigurationError(msg)
    return OpenAIBackend(
        str(getattr(llm, "model_name", None) or getattr(llm, "model", "")),
        base_url=getattr(llm, "openai_api_base", None),
        api_key=secret,
        mode="auto",
    )


def _from_llama(llama: Any, n_threads: int | None) -> Backend:
    from esi_guard.backends.llamacpp import LlamaCppBackend

    return LlamaCppBackend(llama, n_threads=n_threads)


def check_threads(n_threads: int) -> None:
    """A :class:`ConfigurationError` unless ``n_threads`` is a whole number >= 1."""
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
        msg = f"n_threads must be a whole number >= 1, got {n_threads!r}"
        raise ConfigurationError(msg)


def torch_threads(n_threads: int | None) -> None:
    """``torch.set_num_threads(n_threads)``, process-wide; None leaves torch's own (every core)."""
    if n_threads is None:
        return
    check_threads(n_threads)
    from esi_guard.backends.hf._engine import import_torch

    torch = import_torch()
    if torch.get_num_threads() != n_threads:
        torch.set_num_threads(n_threads)
