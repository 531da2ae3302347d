"""ESIGuard(llm=...) and the default model: a backend from what the user already has."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from langchain_openai import ChatOpenAI, OpenAI
from pydantic import SecretStr

from esi_guard import ConfigurationError, ESIGuard, FakeBackend, OpenAIBackend
from esi_guard.backends import embedded
from esi_guard.backends.adapters import backend_for
from esi_guard.backends.embedded import EMBEDDED_MODEL_ID, EmbeddedBackend
from esi_guard.calibration.file import ThresholdFile


def test_a_guard_without_a_model_uses_the_embedded_one_and_loads_nothing_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse() -> Any:
        raise AssertionError("loaded at construction")

    monkeypatch.setattr(embedded, "embedded_backend", refuse)
    guard = ESIGuard(threshold=0.3)
    assert isinstance(guard.backend, EmbeddedBackend)
    assert guard.backend.model_id == EMBEDDED_MODEL_ID
    assert guard.scoring_config.values == "logits"
    assert guard._get_ls_params()["ls_model_name"] == EMBEDDED_MODEL_ID


@pytest.mark.parametrize("cls", [ChatOpenAI, OpenAI])
def test_an_openai_client_becomes_an_openai_backend_on_the_same_server(cls: Any) -> None:
    llm = cls(model="my-model", base_url="http://127.0.0.1:9/v1", api_key=SecretStr("sk-secret"))
    guard = ESIGuard(llm=llm, threshold=0.3)
    backend = guard.backend
    assert isinstance(backend, OpenAIBackend)
    assert (backend.model, backend.base_url) == ("my-model", "http://127.0.0.1:9/v1")
    assert backend._transport._api_key == "sk-secret"  # type: ignore[attr-defined]
    assert "sk-secret" not in repr(guard) + str(guard.model_dump())


def test_a_backend_passes_through_and_both_at_once_is_an_error() -> None:
    fake = FakeBackend()
    assert backend_for(fake) is fake
    with pytest.raises(ConfigurationError, match="not both"):
        ESIGuard(llm="some/model", backend=fake, threshold=0.3)


@pytest.mark.parametrize("llm", [42, object(), ["a", "list"]])
def test_anything_else_is_refused_naming_its_type_and_what_is_accepted(llm: Any) -> None:
    with pytest.raises(ConfigurationError, match=rf"{type(llm).__name__}.*ChatOpenAI"):
        ESIGuard(llm=llm, threshold=0.3)


def test_a_chat_model_around_an_endpoint_is_refused_with_the_reason() -> None:
    from langchain_huggingface import ChatHuggingFace, HuggingFaceEndpoint

    endpoint = HuggingFaceEndpoint(endpoint_url="http://127.0.0.1:9", task="text-generation")
    chat = ChatHuggingFace.model_construct(llm=endpoint)
    with pytest.raises(ConfigurationError, match="gives no logits"):
        backend_for(chat)


def test_from_calibration_takes_llm_too(
    tmp_path: Any, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "threshold.json"
    threshold_file().write(path)
    guard = ESIGuard.from_calibration(path, llm=FakeBackend(), action="abstain")
    assert guard.backend.model_id == "fake" and guard.threshold == 0.3


def test_a_local_model_needs_an_engine_that_can_run_it() -> None:
    from esi_guard.backends.adapters import local_backend

    with pytest.raises(ConfigurationError, match="engine must be 'transformers' or 'llamacpp'"):
        local_backend("default", engine="vllm")
    with pytest.raises(ConfigurationError, match=r"runs a \.gguf file or 'default'"):
        local_backend("org/model", engine="llamacpp")


def test_a_dtype_reaches_transformers_and_llama_cpp_refuses_one(monkeypatch: Any) -> None:
    from esi_guard.backends import hf
    from esi_guard.backends.adapters import local_backend

    seen: dict[str, Any] = {}

    def from_pretrained(cls: Any, model: str, **kwargs: Any) -> str:
        seen.update(kwargs, model=model)
        return "loaded"

    monkeypatch.setattr(hf.HFBackend, "from_pretrained", classmethod(from_pretrained))
    assert local_backend("org/model", dtype="bfloat16", device="cpu") == "loaded"
    assert seen == {"model": "org/model", "dtype": "bfloat16", "device": "cpu",
                    "chat_template": None}  # fmt: skip
    seen.clear()
    local_backend("org/model")
    assert "dtype" not in seen  # the backend's own default
    with pytest.raises(ConfigurationError, match="a dtype \\('bfloat16'\\) is for transformers"):
        local_backend("default", engine="llamacpp", dtype="bfloat16")
