"""The real models the tests use, each loaded once per test session."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from esi_guard import HFBackend


def embedded_backend() -> HFBackend:
    """The embedded default model, SmolLM2-135M-Instruct, on CPU: the process's one copy,
    the same one a guard built without a model uses."""
    from esi_guard.backends.default import embedded_backend as shared

    return shared()
