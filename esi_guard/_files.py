"""One reader for the package's JSON files (threshold file, ESI probe), each ``format``-tagged."""

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

    ``name`` names it in messages; ``kind`` and ``hint`` fill the one for a wrong ``format``.
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
