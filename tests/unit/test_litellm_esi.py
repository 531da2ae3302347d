"""ESIGuardrail's esi object is the one esi-guard serve sends for the same result."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
pytest.importorskip("litellm")

from esi_guard import ESIGuard, FakeBackend
from esi_guard.litellm_guardrail import esi_summary
from esi_guard.server._schema import esi_info

pytestmark = pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning")


def test_the_guardrails_esi_is_the_servers() -> None:
    guard = ESIGuard(backend=FakeBackend(default_sensitivity=1.0), threshold=0.1, n_variants=4)
    result = guard.score("Which river flows through Tübingen?", "The Danube. It is long.")
    assert esi_summary(result) == esi_info(result.as_dict())  # it left out decided_by...
