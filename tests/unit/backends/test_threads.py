"""CPU threads a user sets (``ESIGuard(n_threads=N)``, ``--threads``): the embedded model's
shared copies are kept by thread count, transformers gets them process-wide, and a ready
backend refuses them. That they reach every llama.cpp context the backend makes is tested
on the real model, in ``tests/integration/test_llamacpp_backend.py``."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard.backends import adapters, embedded
from esi_guard.backends.embedded import EmbeddedBackend


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The embedded model's llama.cpp loads (faked), from a process that has none yet."""
    from esi_guard.backends.llamacpp import LlamaCppBackend

    loads: list[dict[str, Any]] = []

    def load(**kwargs: Any) -> FakeBackend:
        loads.append(kwargs)
        return FakeBackend()

    monkeypatch.setattr(embedded, "_LOADED", {})
    monkeypatch.setattr(embedded, "_LLAMA_CPP", True)
    monkeypatch.setattr(LlamaCppBackend, "default", load)
    return loads


def test_guards_asking_for_other_threads_get_the_embedded_copy_with_them(
    copies: list[dict[str, Any]],
) -> None:
    one, two, again, unset = (
        ESIGuard(n_threads=1, threshold=0.3),
        ESIGuard(n_threads=2, threshold=0.3),
        ESIGuard(n_threads=1, threshold=0.3),
        ESIGuard(threshold=0.3),
    )
    assert copies == []  # nothing loads before the first answer
    assert isinstance(one.backend, EmbeddedBackend) and one.backend.n_threads == 1
    assert one.backend.loaded is again.backend.loaded  # the same threads: one copy
    assert two.backend.loaded is not one.backend.loaded
    assert unset.backend.loaded not in (one.backend.loaded, two.backend.loaded)
    assert copies == [{"n_threads": 1}, {"n_threads": 2}, {"n_threads": None}]
    assert "n_threads=2" in repr(two.backend) and "n_threads" not in repr(unset.backend)


def test_the_shipped_threshold_holds_whatever_the_threads(copies: list[dict[str, Any]]) -> None:
    guard, plain = ESIGuard(n_threads=1), ESIGuard()
    assert guard.threshold == plain.threshold and guard.scoring_config == plain.scoring_config


def test_transformers_shares_one_copy_and_sets_torch_threads_for_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from esi_guard.backends.hf import HFBackend

    torch = pytest.importorskip("torch")
    monkeypatch.setattr(embedded, "_LOADED", {})
    monkeypatch.setattr(embedded, "_LLAMA_CPP", False)
    monkeypatch.setattr(HFBackend, "default", lambda **kwargs: FakeBackend())
    asked: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", asked.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    first = EmbeddedBackend(n_threads=1).loaded
    assert EmbeddedBackend(n_threads=3).loaded is first and EmbeddedBackend().loaded is first
    assert asked == [1, 3]  # None leaves torch's own


def test_a_named_model_is_loaded_with_the_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[tuple[str, int | None]] = []

    def local_backend(model: str, *, n_threads: int | None = None) -> FakeBackend:
        loads.append((model, n_threads))
        return FakeBackend()

    monkeypatch.setattr(adapters, "local_backend", local_backend)
    ESIGuard(llm="default", n_threads=1, threshold=0.3)
    ESIGuard(llm="model.gguf", threshold=0.3)
    assert loads == [("default", 1), ("model.gguf", None)]


def test_threads_for_a_model_the_guard_does_not_run_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"n_threads.*FakeBackend.*from_path"):
        ESIGuard(backend=FakeBackend(), n_threads=1, threshold=0.3)
    client = ChatOpenAI(model="m", base_url="http://127.0.0.1:9/v1", api_key=SecretStr("k"))
    with pytest.raises(ConfigurationError, match=r"n_threads.*ChatOpenAI"):
        ESIGuard(llm=client, n_threads=1, threshold=0.3)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigurationError, match="n_threads must be a whole number >= 1"):
            ESIGuard(n_threads=bad, threshold=0.3)
