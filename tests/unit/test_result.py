"""The one ScoringConfig: what the guard, its results, the runner and the threshold file share."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from esi_guard import ConfigurationError, ESIGuard, FakeBackend, ScoringConfig, SkipOneChar, Typo


def config(**changes: object) -> ScoringConfig:
    values: dict[str, object] = {
        "intervention": SkipOneChar().describe(), "n_variants": 10, "top_k": 100,
        "distance": "hellinger", "values": "logits", "approximate": False, "seed": 0,
        "max_new_tokens": 64,
    }  # fmt: skip
    return ScoringConfig(**{**values, **changes})


def test_the_guard_the_result_and_the_file_share_one_config() -> None:
    guard = ESIGuard(backend=FakeBackend(), threshold=0.3)
    assert guard.scoring_config == config()
    esi = guard.invoke("Which river flows through Timbuktu?").response_metadata["esi"]
    assert ScoringConfig(**esi["scoring"]) == guard.scoring_config
    json.dumps(esi["scoring"])


def test_differences_name_each_field_that_differs() -> None:
    calibrated = config()
    given = config(top_k=20, intervention=Typo().describe(), system_prompt="Be brief.")
    found = calibrated.differences(given)
    assert [line.split(":")[0] for line in found] == ["intervention", "top_k", "system_prompt"]
    assert "top_k: 100 vs 20" in found
    assert calibrated.differences(given, ignore=("system_prompt", "intervention")) == [
        "top_k: 100 vs 20"
    ]
    assert calibrated.differences(config()) == []


def test_metadata_leaves_out_a_missing_system_prompt() -> None:
    assert "system_prompt" not in config().as_metadata()
    assert config(system_prompt="Be brief.").as_metadata()["system_prompt"] == "Be brief."


def test_a_config_is_validated_and_frozen() -> None:
    with pytest.raises(ValidationError, match="n_variants"):
        config(n_variants=0)
    with pytest.raises(ConfigurationError, match="unknown keyword 'unknown'"):
        config(unknown=1)
    with pytest.raises(ValidationError):
        config().top_k = 5  # type: ignore[misc]
