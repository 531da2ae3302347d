"""Incremental teacher forcing: an answer forced while it grows, a piece at a time.

A :class:`ForcingSession` (:meth:`~esi_guard.backends.base.Backend.open_forcing`) serves scoring a
streamed answer: each :meth:`~ForcingSession.extend` returns the distributions at the new
positions only, under every variant. This default re-forces the whole answer so far each call
(correct everywhere, costly); backends that keep each row's state (llama.cpp) override it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.exceptions import BackendError, ConfigurationError
from esi_guard.scoring import TopK


class Forcer(Protocol):
    """What the default session needs of a backend: its ``teacher_force``."""

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """As :meth:`~esi_guard.backends.base.Backend.teacher_force`."""
        ...


__all__ = ["Forcer", "ForcingSession", "check_opening", "joined", "tail"]


def check_opening(request: ForcingRequest) -> None:
    """A :class:`ConfigurationError` unless ``request`` has no answer and reads no hidden state."""
    if request.answer_ids or request.answer:
        msg = (
            f"a forcing session opens on a request with no answer (extend gives it), got "
            f"{len(request.answer_ids)} answer tokens"
        )
        raise ConfigurationError(msg)
    if request.hidden is not None:
        msg = "a forcing session reads no hidden states: read them from generation"
        raise ConfigurationError(msg)


def tail(forced: Forced, start: int) -> Forced:
    """``forced`` from answer position ``start`` on (``observed`` counted from there)."""

    def cut(topk: TopK) -> TopK:
        return TopK(topk.ids[start:], topk.values[start:])

    observed = None if forced.observed is None else [max(n - start, 0) for n in forced.observed]
    original = None if forced.original is None else cut(forced.original)
    return Forced([cut(row) for row in forced.variants], original, observed)


def joined(pieces: Sequence[Forced], length: int | None = None) -> Forced:
    """A session's pieces as one :class:`Forced` of the whole answer (its first ``length``).

    A variant's ``observed`` count runs on only while every earlier position was observed.
    """
    if not pieces:
        msg = "no forced piece to join"
        raise ConfigurationError(msg)

    def cat(tops: Sequence[TopK]) -> TopK:
        ids = np.concatenate([t.ids for t in tops])[:length]
        return TopK(ids, np.concatenate([t.values for t in tops])[:length])

    variants = [cat([p.variants[row] for p in pieces]) for row in range(len(pieces[0].variants))]
    originals = [p.original for p in pieces if p.original is not None]
    original = cat(originals) if len(originals) == len(pieces) else None
    observed = None
    if any(p.observed is not None for p in pieces):
        observed = []
        for row in range(len(variants)):
            count = 0
            for piece in pieces:
                size = piece.variants[row].n_positions
                seen = size if piece.observed is None else piece.observed[row]
                count += seen
                if seen < size:
                    break
            observed.append(min(count, variants[row].n_positions))
    return Forced(variants, original, observed)


class ForcingSession:
    """One request's answer forced as it grows (the default: re-forced whole each time).

    A context manager (or call :meth:`close`); it serves one caller, changing no other's numbers.

    Args:
        backend: The backend whose ``teacher_force`` it calls.
        request: The request, its answer empty (:func:`check_opening`).
        top_k: The top-k kept at each position.
    """

    def __init__(self, backend: Forcer, request: ForcingRequest, *, top_k: int) -> None:
        check_opening(request)
        self._backend = backend
        self.request = request
        self.top_k = top_k
        self.answer_ids: list[int] = []
        """The answer forced so far."""
        self.answer = ""
        """Its text, as the :meth:`extend` calls gave it."""
        self.closed = False

    @property
    def incremental(self) -> bool:
        """Whether a call decodes only its new tokens (False: this default re-forces)."""
        return False

    def extend(self, answer_ids: Sequence[int], text: str = "") -> Forced | BackendError:
        """Force the answer's next tokens; their distributions, under every row.

        ``text`` is their text, for backends that force text. The result has ``len(answer_ids)``
        positions per row, as ``teacher_force`` of the whole answer so far gives them (up to a
        backend's rounding); a failure comes back in place, and the session should then be closed.
        """
        if self.closed:
            msg = "extend on a closed forcing session"
            raise ConfigurationError(msg)
        start = len(self.answer_ids)
        self.answer_ids += list(answer_ids)
        self.answer += text
        if not answer_ids:
            return self._empty()
        return self._force(start)

    async def aextend(self, answer_ids: Sequence[int], text: str = "") -> Forced | BackendError:
        """Async :meth:`extend`, in a worker thread."""
        return await asyncio.to_thread(self.extend, answer_ids, text)

    def _force(self, start: int) -> Forced | BackendError:
        """The whole answer so far forced again; its positions from ``start`` on."""
        whole = replace(self.request, answer_ids=list(self.answer_ids), answer=self.answer)
        (out,) = self._backend.teacher_force([whole], top_k=self.top_k)
        return out if isinstance(out, BackendError) else tail(out, start)

    def _empty(self) -> Forced:
        def none() -> TopK:
            return TopK(np.zeros((0, self.top_k), np.int64), np.zeros((0, self.top_k)))

        rows = len(self.request.variants)
        original = none() if self.request.include_original else None
        return Forced([none() for _ in range(rows)], original)

    def close(self) -> None:
        """End the session (what it holds is freed); closing twice does nothing."""
        self.closed = True

    def __enter__(self) -> ForcingSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
