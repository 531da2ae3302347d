"""Optional dependencies imported when first needed, with an error naming the extra to install."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_extra"]


def import_extra(module: str, *, needed_by: str, what: str, extra: str) -> Any:
    """``module`` imported, or an ``ImportError`` saying which extra of esi-guard brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        hint = f"install the '{extra}' extra: pip install 'esi-guard[{extra}]'"
        msg = f"{needed_by} needs {what}; {hint}"
        raise ImportError(msg) from exc
