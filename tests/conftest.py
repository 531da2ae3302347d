"""Shared fixtures: the real embedded model (loaded once) and real questions from ../shared/data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.models import embedded_backend
from tests.shared_data import SharedDataMissing
from tests.shared_data import shared_data as find_shared_data

if TYPE_CHECKING:
    from esi_guard import HFBackend


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
