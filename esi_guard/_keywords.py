"""No silently ignored settings: an unknown keyword is a ConfigurationError naming it.

A dropped misspelling (``actoin="abstain"``) would leave the guard doing what was not asked, so
every public configuration object refuses unknown keywords and suggests the one probably meant.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from esi_guard.exceptions import ConfigurationError

__all__ = ["check_keywords", "strict_keywords", "unknown_keyword"]

F = TypeVar("F", bound=Callable[..., Any])


def unknown_keyword(owner: str, name: str, valid: Iterable[str]) -> ConfigurationError:
    """The error for ``name``, which ``owner`` does not take, with the nearest valid name."""
    known = sorted(set(valid))
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    msg = f"{owner} got an unknown keyword {name!r}{hint} (valid: {', '.join(known)})"
    return ConfigurationError(msg)


def check_keywords(owner: str, given: Iterable[str], valid: Iterable[str]) -> None:
    """Raise :func:`unknown_keyword`'s error for the first of ``given`` not in ``valid``."""
    known = set(valid)
    for name in given:
        if name not in known:
            raise unknown_keyword(owner, name, known)


def strict_keywords(function: F) -> F:
    """Make ``function`` refuse keywords it does not name (unless it passes ``**kwargs`` on)."""
    signature = inspect.signature(function)
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        return function
    names = {
        name
        for name, p in signature.parameters.items()
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and name not in ("self", "cls")
    }
    owner = function.__qualname__.removesuffix(".__init__")

    @functools.wraps(function)
    def checked(*args: Any, **kwargs: Any) -> Any:
        check_keywords(owner, kwargs, names)
        return function(*args, **kwargs)

    return checked  # type: ignore[return-value]
