"""llama-cpp-python itself: importing it with a clear error, and freeing its objects at exit."""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any, Protocol

from esi_guard._imports import import_extra

__all__ = ["close_at_exit", "import_llama_cpp"]


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or an ``ImportError`` naming the extra to install."""
    return import_extra(
        "llama_cpp", needed_by="LlamaCppBackend", what="llama-cpp-python", extra="llamacpp"
    )


class _Closable(Protocol):
    llama: Any

    def close(self) -> None: ...


_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()
"""Backends alive, whose llama.cpp objects :func:`_close_all` frees at interpreter exit."""


def close_at_exit(backend: _Closable) -> None:
    """Free ``backend``'s llama.cpp objects at interpreter exit if it is still alive then."""
    _OPEN.add(backend)


def _close_all() -> None:
    """Free the live backends' llama.cpp objects at exit, while llama_cpp is whole.

    Else they are freed after its globals are gone (a ``TypeError`` from ``free_model``), and its
    two ``/dev/null`` files are never closed (a ``ResourceWarning``).
    """
    for backend in list(_OPEN):
        backend.close()
        backend.llama.close()
    utils = sys.modules.get("llama_cpp._utils")
    for name in ("outnull_file", "errnull_file"):
        handle = getattr(utils, name, None)
        if handle is not None:
            handle.close()


atexit.register(_close_all)
