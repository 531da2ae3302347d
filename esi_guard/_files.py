"""Reading the package's JSON files (a threshold file, an ESI probe): one reader for all.

Each file is plain JSON with a ``format`` tag, validated by its pydantic model; every
problem is a :class:`~esi_guard.exceptions.ConfigurationError` naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from esi_guard.exceptions import ConfigurationError

__all__ = ["read_model"]

M = TypeVar("M", bound=BaseModel)


def read_model(
    model: type[M], path: str | Path, *, name: str, kind: str, file_format: str, hint: str = ""
) -> M:
    """``path`` read as ``model``; a ConfigurationError naming the file says what is wrong.

    ``name``: what the messages call the file (``threshold file``); ``kind``: what it is
    not when its ``format`` is not ``file_format`` (``an esi-guard threshold file``);
    ``hint``: appended to that message (``; `esi-guard distill` writes one``).
    """
    where = Path(path)
    try:
        raw = json.loads(where.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        msg = f"{name} not found: {where}"
        raise ConfigurationError(msg) from exc
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        msg = f"{name} {where} is not readable JSON: {exc}"
        raise ConfigurationError(msg) from exc
    if not isinstance(raw, dict) or raw.get("format") != file_format:
        msg = f"{where} is not {kind} (format {file_format!r} expected{hint})"
        raise ConfigurationError(msg)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        cause = exc.errors()[0].get("ctx", {}).get("error")
        if isinstance(cause, ConfigurationError):  # a validator's own one line (a retired mode)
            msg = f"{name} {where}: {cause}"
            raise ConfigurationError(msg) from exc
        msg = f"{name} {where} is invalid: {exc}"
        raise ConfigurationError(msg) from exc
