"""Shared fixtures: the real embedded model (loaded once) and real questions from ../shared/data."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from esi_guard import HFBackend

CHECKOUT = Path(__file__).resolve().parents[1]


def _shared_data_candidates() -> list[Path]:
    """$ESI_GUARD_SHARED_DATA, ../shared/data beside the checkout, and, for a clone of a
    local checkout (e.g. a scratch clone in /tmp), ../shared/data beside its origin."""
    candidates = [CHECKOUT.parent / "shared" / "data"]
    if os.environ.get("ESI_GUARD_SHARED_DATA"):
        candidates.insert(0, Path(os.environ["ESI_GUARD_SHARED_DATA"]))
    origin = subprocess.run(
        ["git", "-C", str(CHECKOUT), "config", "--get", "remote.origin.url"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if origin and Path(origin).is_dir():
        candidates.append(Path(origin).resolve().parent / "shared" / "data")
    return candidates


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared QA sets (read in place, never copied)."""
    candidates = _shared_data_candidates()
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    looked = ", ".join(str(c) for c in candidates)
    pytest.fail(f"shared data missing: looked in {looked}; set ESI_GUARD_SHARED_DATA")


@pytest.fixture(scope="session")
def sciq_questions(shared_data: Path) -> list[str]:
    """Questions from the shared SciQ set."""
    path = shared_data / "sciq" / "test.jsonl"
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line)["query"] for line in handle if line.strip()]


@pytest.fixture(scope="session")
def hf_backend() -> HFBackend:
    """The embedded default model, SmolLM2-135M-Instruct, loaded once per session on CPU."""
    from esi_guard import HFBackend

    return HFBackend.default(device="cpu")
