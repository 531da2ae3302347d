"""The real models the tests use, each loaded once per test session."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esi_guard import HFBackend


@functools.cache
def embedded_backend() -> HFBackend:
    """The embedded default model, SmolLM2-135M-Instruct, on CPU."""
    from esi_guard import HFBackend

    return HFBackend.default(device="cpu")
