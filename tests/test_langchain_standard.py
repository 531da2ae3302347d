"""What the guard promises as a LangChain chat model: LangChain's own standard suites.

`langchain-tests` is the contract the partner packages (langchain-openai,
langchain-huggingface, ...) run in their CI. The guard runs both suites unchanged: the
unit suite on the in-package fake backend, the integration suite on the real embedded
model. No test is overridden. The capability properties say what the guard really does:
it calls no tools, has no structured output or JSON mode, takes text only, answers with
the model it was built with (no per-call model override) and reports usage.

One standard setting is left out of the constructor keywords: ``timeout``, ``max_retries``
and ``api_key`` configure a server client, so they belong to ``OpenAIBackend(...)``, not
to a guard over a local model, which refuses keywords it does not know rather than
ignore them (``temperature`` is taken only as 0, ``max_tokens`` and ``stop`` as is).
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from esi_guard import ESIGuard, FakeBackend
from tests.models import embedded_backend

STANDARD_KEYWORDS = {"temperature": 0, "max_tokens": 24, "stop": []}


class TestESIGuardUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ESIGuard]:
        return ESIGuard

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backend": FakeBackend(default_answer="Hello there"), "threshold": 0.3}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return dict(STANDARD_KEYWORDS)

    @property
    def supports_model_override(self) -> bool:
        return False


@pytest.mark.integration
@pytest.mark.slow
class TestESIGuardIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[ESIGuard]:
        return ESIGuard

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"backend": embedded_backend(), "threshold": 0.3}

    @property
    def standard_chat_model_params(self) -> dict[str, Any]:
        return dict(STANDARD_KEYWORDS)

    @property
    def supports_model_override(self) -> bool:
        return False
