"""Modes retired in 0.2.0: a guard, a file or a command asking for one is told what replaces it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from esi_guard import ConfigurationError, ESIGuard, FakeBackend
from esi_guard._retired import RELEASE
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import app

QUESTION = "What is the capital of Canada?"


def fake() -> FakeBackend:
    return FakeBackend({QUESTION: "Ottawa"})


@pytest.mark.parametrize("setting", [{"min_variants": 2}, {"stop_constant": 1.0},
                                     {"min_variants": 2, "stop_constant": 1.0}])  # fmt: skip
def test_a_guard_asking_for_sequential_esi_is_told_what_replaces_it(
    setting: dict[str, float],
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        ESIGuard(backend=fake(), threshold=0.5, **setting)
    message = str(caught.value)
    assert "\n" not in message
    assert f"retired in esi-guard {RELEASE}" in message and "value cascade" in message
    assert message.startswith("ESIGuard: sequential ESI")


def test_unset_fields_of_a_retired_mode_are_read_as_before(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    """Every file written before 0.2.0 holds them, as null."""
    path = tmp_path / "old.json"
    raw = json.loads(threshold_file().model_dump_json())
    raw["sequential"] = None
    raw["scoring"] |= {"min_variants": None, "stop_constant": None}
    path.write_text(json.dumps(raw))
    guard = ESIGuard.from_calibration(path, backend=fake())
    assert guard.invoke(QUESTION).response_metadata["esi"]["scored"]
    assert "min_variants" not in guard.scoring_config.model_dump()


@pytest.mark.parametrize(
    "change",
    [
        {"sequential": {"constant": 1.0, "min_variants": 2}},
        {"scoring": {"min_variants": 2, "stop_constant": 1.0}},
    ],
)
def test_a_file_of_sequential_esi_is_refused_in_one_line(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile], change: dict[str, object]
) -> None:
    path = tmp_path / "sequential.json"
    raw = json.loads(threshold_file().model_dump_json())
    for key, value in change.items():
        raw[key] = raw[key] | value if isinstance(value, dict) and key == "scoring" else value
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigurationError) as caught:
        ESIGuard.from_calibration(path, backend=fake())
    message = str(caught.value)
    assert "\n" not in message and str(path) in message
    assert f"retired in esi-guard {RELEASE}" in message and "calibrate --score combined" in message


def test_calibrate_min_variants_is_refused_before_any_model_loads(tmp_path: Path) -> None:
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": QUESTION, "answers": ["Ottawa"]}) + "\n")
    out = tmp_path / "t.json"
    result = CliRunner().invoke(
        app, ["calibrate", "--data", str(data), "--out", str(out), "--min-variants", "2"]
    )
    assert result.exit_code != 0
    assert "sequential ESI" in result.output and RELEASE in result.output
    assert not out.exists()


def test_an_esi_probe_cascade_on_a_combined_score_is_refused(
    tmp_path: Path, threshold_file: Callable[..., ThresholdFile]
) -> None:
    """Built by hand, or read from a file that holds both: one line naming the value cascade."""
    from esi_guard.cascade import Band, ESIProbe
    from esi_guard.combined import CombinedScore

    probe = ESIProbe(model=fake().model_id, features=(), mean=(), scale=(), weights=(),
                     intercept=0.5, strength=0.0, band=0.1, coverage=0.98, n_fit=0)  # fmt: skip
    combined = CombinedScore(mean=(0.0, 0.0, 0.0), scale=(1.0, 1.0, 1.0),
                             weights=(1.0, 0.0, 0.0), intercept=0.0, strength=0.1,
                             n_fit=100)  # fmt: skip
    with pytest.raises(ConfigurationError, match=f"retired in esi-guard {RELEASE}.*--cascade"):
        ESIGuard(backend=fake(), threshold=0.5, esi_probe=probe, combined=combined)
    raw = json.loads(threshold_file().model_dump_json())
    raw |= {
        "esi_probe": probe.model_dump(mode="json"),
        "combined": combined.model_dump(mode="json"),
        "probe_band": Band(low=0.4, high=0.6).model_dump(mode="json"),
    }
    path = tmp_path / "probe-on-combined.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigurationError) as caught:
        ESIGuard.from_calibration(path, backend=fake())
    assert "\n" not in str(caught.value) and "ESI-probe cascade on a combined score" in str(
        caught.value
    )
