"""Backends: the engines that give ESI its token distributions.

``HFBackend`` is imported from here without importing torch: its heavy imports happen
when a model is loaded.
"""

from esi_guard.backends.base import (
    Backend,
    ChatMessage,
    Forced,
    ForcingRequest,
    Generation,
    Messages,
)
from esi_guard.backends.fake import FakeBackend
from esi_guard.backends.hf import HFBackend

__all__ = [
    "Backend",
    "ChatMessage",
    "FakeBackend",
    "Forced",
    "ForcingRequest",
    "Generation",
    "HFBackend",
    "Messages",
]
