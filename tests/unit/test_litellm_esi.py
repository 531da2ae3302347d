"""ESIGuardrail's esi object is the one esi-guard serve sends for the same result."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
pytest.importorskip("litellm")

from esi_guard import ESIGuard, FakeBackend
from esi_guard.applied import esi_info
from esi_guard.litellm_guardrail import esi_summary

pytestmark = pytest.mark.filterwarnings("ignore:Item .* `ReadOnly` qualifier:UserWarning")


def test_the_guardrails_esi_is_the_servers() -> None:
    guard = ESIGuard(backend=FakeBackend(default_sensitivity=1.0), threshold=0.1, n_variants=4)
    result = guard.score("Which river flows through Tübingen?", "The Danube. It is long.")
    assert esi_summary(result) == esi_info(result.as_dict())  # it left out decided_by...


def test_the_guardrail_imports_no_server() -> None:
    # The LiteLLM proxy's environment has the litellm extra, not serve's (prometheus-client):
    # an import of esi_guard.server there was a 500 on every guarded call.
    import subprocess
    import sys

    code = ("import sys, esi_guard.litellm_guardrail as g, esi_guard as e; "
            "g.esi_summary(e.ESIGuard(backend=e.FakeBackend(), threshold=0.3)"
            ".score('Which river flows through Paris?', 'The Seine.')); "
            "assert not any(m.startswith('esi_guard.server') for m in sys.modules), "
            "sorted(m for m in sys.modules if m.startswith('esi_guard.server'))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
