"""The real models the tests use, each loaded once per test session."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esi_guard import HFBackend


@cache
def embedded_backend() -> HFBackend:
    """The embedded default model, SmolLM2-135M-Instruct, through transformers on CPU."""
    from esi_guard import HFBackend

    return HFBackend.default(device="cpu")
