"""ESIGuard's settings: the shipped threshold, the threshold's range, one-line errors."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard.backends.embedded import EmbeddedBackend, embedded_threshold
from esi_guard.calibration.file import ThresholdFile
from esi_guard.guard._config import shipped_settings


def fake() -> FakeBackend:
    return FakeBackend({"What is the capital of France?": "Paris"})


def test_the_embedded_model_ships_its_threshold_and_the_settings_it_was_fitted_with() -> None:
    shipped = ThresholdFile.read(embedded_threshold())
    guard = ESIGuard()  # nothing is loaded until the first answer
    assert isinstance(guard.backend, EmbeddedBackend)
    assert guard.threshold == shipped.threshold
    assert guard.max_new_tokens == shipped.scoring.max_new_tokens
    assert guard.intervention.describe() == shipped.scoring.intervention
    assert shipped.model == guard.backend.model_id and shipped.engine == guard.backend.engine
    assert not shipped.scoring.differences(
        guard.scoring_config, ignore=("system_prompt", "prompt_template")
    )


def test_a_setting_the_shipped_threshold_was_not_fitted_with_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"n_variants: 10 vs 5.*give threshold="):
        ESIGuard(n_variants=5)
    with pytest.raises(ConfigurationError, match="max_new_tokens: 64 vs 3"):
        ESIGuard(max_tokens=3)
    assert ESIGuard(n_variants=5, threshold=0.3).n_variants == 5  # a threshold of one's own


def test_shipped_settings_fill_only_what_was_not_given(tmp_path: Path) -> None:
    shipped = ThresholdFile.read(embedded_threshold())
    settings = shipped_settings({"action": "abstain"}, embedded_threshold()).kwargs
    assert settings["action"] == "abstain" and settings["threshold"] == shipped.threshold
    assert settings["top_k"] == shipped.scoring.top_k


def test_another_model_needs_a_threshold_in_one_line() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ESIGuard(backend=fake())
    message = str(caught.value)
    assert "\n" not in message and "threshold=" in message and "esi-guard calibrate" in message


@pytest.mark.parametrize("threshold", [-0.1, 5.0, math.log(100) + 0.01])
def test_a_threshold_outside_the_scores_range_is_refused(threshold: float) -> None:
    with pytest.raises(ConfigurationError, match=r"outside the range of ESI scores with hellinger"):
        ESIGuard(backend=fake(), threshold=threshold)


def test_the_range_follows_the_distance_and_k() -> None:
    assert ESIGuard(backend=fake(), threshold=math.log(100)).threshold == math.log(100)
    assert ESIGuard(backend=fake(), threshold=50.0, distance="kl").threshold == 50.0
    with pytest.raises(ConfigurationError, match=r"\[0, 1.609\]"):
        ESIGuard(backend=fake(), threshold=2.0, top_k=5)


def test_an_invalid_setting_is_one_line_naming_the_field_and_value() -> None:
    with pytest.raises(ConfigurationError) as caught:
        ESIGuard(backend=fake(), threshold=0.2, n_variants=0)
    message = str(caught.value)
    assert "\n" not in message and "n_variants" in message and "got 0" in message


def test_the_unknown_keyword_hint_names_the_guards_own_settings_only() -> None:
    with pytest.raises(ConfigurationError, match="did you mean 'action'") as caught:
        ESIGuard(backend=fake(), threshold=0.2, actoin="abstain")
    message = str(caught.value)
    assert "threshold" in message and "max_tokens" in message
    for langchain_field in ("callbacks", "rate_limiter", "disable_streaming", "verbose"):
        assert langchain_field not in message


def test_from_calibration_takes_langchains_max_tokens_name_for_the_files_setting() -> None:
    guard = ESIGuard.from_calibration(embedded_threshold(), max_tokens=64)
    assert guard.max_new_tokens == 64
    with pytest.raises(ConfigurationError, match="max_new_tokens: 64 vs 3"):
        ESIGuard.from_calibration(embedded_threshold(), max_tokens=3)


def test_a_files_granularity_says_what_its_threshold_applies_to(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    path = tmp_path / "sentences.json"
    threshold_file(granularity="sentence").write(path)
    assert "decide_on" not in json.loads(path.read_text(encoding="utf-8"))["scoring"]
    guard = ESIGuard.from_calibration(path, backend=FakeBackend())
    assert guard.decide_on == "sentences"
    with pytest.raises(ConfigurationError, match="decide_on: 'sentences' vs 'esi'"):
        ESIGuard.from_calibration(path, backend=FakeBackend(), decide_on="esi")
    # a file written before 0.2.0 says it in its scoring too: it reads as before
    raw = json.loads(path.read_text(encoding="utf-8"))
    raw["scoring"]["decide_on"] = "sentences"
    path.write_text(json.dumps(raw), encoding="utf-8")
    assert ESIGuard.from_calibration(path, backend=FakeBackend()).decide_on == "sentences"
    answers = tmp_path / "answers.json"
    threshold_file().write(answers)
    assert ESIGuard.from_calibration(answers, backend=FakeBackend()).decide_on == "esi"
    # an answer file's ESI threshold judges each sentence too (as action="redact" does)
    guard = ESIGuard.from_calibration(answers, backend=FakeBackend(), decide_on="sentences")
    assert guard.decide_on == "sentences"
