"""A hidden-state probe applies on every engine that reads the same states (``states_engine``):
``llamacpp-f16`` forces on a float copy but reads the states of ``llamacpp``."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends import FINAL, POSITIONS, Generation, HiddenSpec
from esi_guard.calibration.combined_fit import fit_combined
from esi_guard.calibration.file import ThresholdFile
from esi_guard.exceptions import EngineMismatchWarning
from esi_guard.guard import _shipped

SPEC = HiddenSpec((1, 3, FINAL), POSITIONS)
DIGEST = "ab" * 32


class Gguf(FakeBackend):
    """The fake, as a GGUF on llama.cpp."""

    @property
    def model_id(self) -> str:
        return "some-model"

    @property
    def engine(self) -> str:
        return "llamacpp"

    @property
    def model_sha256(self) -> str | None:
        return DIGEST


def probe_file(threshold_file: Callable[..., ThresholdFile], engine: str) -> ThresholdFile:
    rng = np.random.default_rng(0)
    questions = [f"What is the name of thing number {i}?" for i in range(60)]
    levels = {q: float(rng.uniform(0.0, 1.0)) for q in questions}
    backend = FakeBackend(sensitivity=levels)
    gens = backend.generate([[{"role": "user", "content": q}] for q in questions],
                            max_new_tokens=8, top_k=10, hidden=SPEC)  # fmt: skip
    states = [g.hidden for g in gens if isinstance(g, Generation) and g.hidden is not None]
    signals = [{"esi": 0.0, "nll": 1.0, "entropy": 1.0} for _ in questions]
    wrong = [int(levels[q] > 0.5) for q in questions]
    model = fit_combined(signals, wrong, features=("nll",), hidden=states)
    return threshold_file(combined=model, threshold=0.5, engine=engine, model="some-model",
                          model_sha256=DIGEST)  # fmt: skip


def test_a_probe_file_from_llamacpp_f16_applies_on_llamacpp_with_a_warning(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "probe.json"
    probe_file(threshold_file, "llamacpp-f16").write(path)
    with pytest.warns(EngineMismatchWarning):
        guard = ESIGuard.from_calibration(path, backend=Gguf())
    assert guard.combined is not None


def test_the_shipped_file_chosen_for_a_backend_is_one_its_guard_accepts(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile], monkeypatch: pytest.MonkeyPatch
) -> None:
    probe_file(threshold_file, "llamacpp-f16").write(tmp_path / "some-model.json")
    monkeypatch.setattr(_shipped, "SHIPPED", tmp_path)
    _shipped.shipped.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", EngineMismatchWarning)
            guard = ESIGuard(backend=Gguf())
        assert guard.threshold_source == "shipped:some-model.json"
    finally:
        _shipped.shipped.cache_clear()
