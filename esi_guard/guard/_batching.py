"""How ``batch`` stays batched through the backend while each prompt keeps its own run.

``batch`` runs every step once for all prompts, then invokes each as any chat model would; the
prompt's decided item waits in a context variable, and ``_generate`` takes it from there.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from esi_guard._keywords import check_keywords
from esi_guard._pipeline.items import GuardedPrompt, Item
from esi_guard.guard._assess import Checked
from esi_guard.guard._assess import items as parsed

__all__ = ["item_for", "items", "kept", "prefetched"]

_PREFETCHED: ContextVar[Item | None] = ContextVar("esi_guard_prefetched", default=None)


def items(inputs: Sequence[Any], kwargs: dict[str, Any], checked: Checked) -> list[Item | None]:
    """An item per input that parses, ``checked`` as invoke asks it (others fail when invoked)."""
    check_keywords("ESIGuard call", kwargs, ("stop",))
    return [item if isinstance(item, Item) else None for item in parsed(inputs, checked)]


def item_for(prompt: GuardedPrompt) -> Item:
    """The item batch ran for this prompt, when it is the one being invoked; else a new one."""
    prefetched = _PREFETCHED.get()
    if prefetched is not None and prefetched.prompt == prompt:
        return prefetched
    return Item(prompt)


@contextmanager
def prefetched(item: Item | None) -> Iterator[None]:
    """While invoking one prompt of a batch: the item the batch ran for it."""
    token = _PREFETCHED.set(item)
    try:
        yield
    finally:
        _PREFETCHED.reset(token)


@contextmanager
def kept(out: list[Any], return_exceptions: bool) -> Iterator[None]:
    """With ``return_exceptions``, a prompt's error takes its place in ``out``."""
    try:
        yield
    except Exception as exc:
        if not return_exceptions:
            raise
        out.append(exc)
