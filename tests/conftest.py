"""Shared fixtures: the real embedded model (loaded once), real questions from ../shared/data,
and a valid threshold file to change one field of."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from benchmarks.shared_data import SharedDataMissing
from benchmarks.shared_data import shared_data as find_shared_data
from tests.models import embedded_backend

if TYPE_CHECKING:
    from esi_guard import HFBackend
    from esi_guard.backends import Backend
    from esi_guard.calibration.file import ThresholdFile


NO_MODEL = "ESI_GUARD_TEST_NO_MODEL"
"""Set by ``make test-fast``: any test that loads a real model fails, naming the marker."""


def pytest_configure(config: pytest.Config) -> None:
    """Under :data:`NO_MODEL`, loading a GGUF (llama.cpp) or pretrained weights fails."""
    if not os.environ.get(NO_MODEL):
        return
    msg = "the fast tier loads no model: mark this test `integration` (or give it a stand-in)"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(msg)

    try:
        import llama_cpp
    except ImportError:
        pass
    else:
        config.add_cleanup(_patched(llama_cpp.Llama, "__init__", refuse))
    try:
        from transformers import modeling_utils
    except ImportError:
        return
    config.add_cleanup(_patched(modeling_utils.PreTrainedModel, "from_pretrained", refuse))


def _patched(owner: Any, name: str, value: Any) -> Callable[[], None]:
    """Replace ``owner.name`` with ``value``; the function that puts it back."""
    old = owner.__dict__[name]
    setattr(owner, name, value if name == "__init__" else classmethod(value))
    return lambda: setattr(owner, name, old)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared QA sets (read in place, never copied)."""
    try:
        return find_shared_data()
    except SharedDataMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def sciq_questions(shared_data: Path) -> list[str]:
    """Questions from the shared SciQ set."""
    path = shared_data / "sciq" / "test.jsonl"
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line)["query"] for line in handle if line.strip()]


@pytest.fixture(scope="session")
def hf_backend() -> HFBackend:
    """The embedded default model, SmolLM2-135M-Instruct, loaded once per session on CPU."""
    return embedded_backend()


@pytest.fixture(scope="module", params=["llamacpp", "transformers"])
def white_box(request: pytest.FixtureRequest) -> Backend:
    """The embedded model on each white-box engine (transformers: the session's shared copy)."""
    if request.param == "llamacpp":
        pytest.importorskip("llama_cpp")
        from esi_guard import LlamaCppBackend

        return LlamaCppBackend.default(n_threads=1)
    backend: Backend = request.getfixturevalue("hf_backend")
    return backend


@pytest.fixture
def threshold_file() -> Callable[..., ThresholdFile]:
    """Build a valid threshold file for the fake backend; keyword arguments replace its fields."""
    from esi_guard import SkipOneChar
    from esi_guard.calibration.file import DatasetInfo, ThresholdFile
    from esi_guard.result import ScoringConfig

    def make(**changes: Any) -> ThresholdFile:
        values: dict[str, Any] = {
            "threshold": 0.3, "method": "coverage=0.8", "calibration_coverage": 0.8,
            "calibration_selective_risk": 0.2, "model": "fake",
            "scoring": ScoringConfig(intervention=SkipOneChar().describe(), n_variants=10,
                                     top_k=100, distance="hellinger", values="logits",
                                     approximate=False, seed=0, max_new_tokens=64),
            "label_method": "containment",
            "dataset": DatasetInfo(path="d.jsonl", sha256="0" * 64, n=10),
            "metrics": {"auroc": {"value": 0.7, "low": 0.6, "high": 0.8}},
            "created": "2026-11-22T00:00:00+00:00", "esi_guard_version": "0.1.0",
        }  # fmt: skip
        values.update(changes)
        return ThresholdFile(**values)

    return make
