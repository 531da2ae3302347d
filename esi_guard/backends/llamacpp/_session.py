"""Incremental teacher forcing on llama.cpp: each row's KV cells kept between pieces.

:class:`Session` holds one request's rows, each a sequence on a context of its own
(:class:`~._engine.Engine` on the forcing weights). Each :meth:`~Session.extend` decodes only the
new tokens in every row, so forcing an answer piece by piece costs what forcing it once does. Its
own context shares no KV cache, decode or lock with other requests; its numbers equal one-shot
``teacher_force``'s up to llama.cpp's rounding, which moves with a decode's shape (:mod:`._pack`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from esi_guard.backends._session import Forcer, ForcingSession
from esi_guard.backends._types import Forced, ForcingRequest
from esi_guard.backends.llamacpp._engine import Engine, Row, topk_rows
from esi_guard.backends.llamacpp._pack import forced
from esi_guard.exceptions import BackendError, ContextLengthError

__all__ = ["Contexts", "Session", "cells"]


def cells(rows: Sequence[Sequence[int]], shared: int, answer: int) -> int:
    """KV cells a session of ``rows`` needs for an answer of ``answer`` tokens."""
    return shared + sum(len(row) - shared + answer for row in rows)


class Contexts:
    """Sessions' contexts on the forcing weights; the largest closed one is kept for the next."""

    def __init__(self, llama: Any, n_seq_max: int, n_threads: int | None) -> None:
        self._llama = llama
        self._n_seq_max = n_seq_max
        self._n_threads = n_threads
        self._idle: list[Engine] = []
        self._lock = threading.Lock()
        self._closed = False

    def take(self, need: int, rows: int) -> Engine:
        """A context of at least ``need`` cells and ``rows`` sequences, its KV cache empty."""
        with self._lock:
            for engine in self._idle:
                if engine.n_ctx >= need and engine.n_seq_max >= rows:
                    self._idle.remove(engine)
                    return engine
        return Engine(self._llama, n_ctx=max(need, 256), n_seq_max=max(rows, self._n_seq_max),
                      n_threads=self._n_threads)  # fmt: skip

    def give(self, engine: Engine) -> None:
        """Take a closed session's context back (its KV cache cleared)."""
        with self._lock:
            self._idle.append(engine)
            self._idle.sort(key=lambda e: e.n_ctx)
            while len(self._idle) > (0 if self._closed else 1):
                self._idle.pop(0).close()

    def close(self) -> None:
        """Free the kept contexts; those of sessions still open are freed as they close."""
        with self._lock:
            self._closed = True
            while self._idle:
                self._idle.pop().close()


class Session(ForcingSession):
    """One request's rows on ``engine``, forced a piece of the answer at a time.

    Args:
        backend: The backend (the default's ``teacher_force``; unused here).
        engine: A context of the session's own, its KV cache empty.
        rows: The rendered prompts, the original first when ``with_original``.
        shared: Leading tokens all rows share, decoded once.
        request: The request the session was opened for (no answer yet).
        top_k: Top-k kept at each position.
        with_original: The first row is the original prompt (``Forced.original``).
        model_id: For the error of a non-finite result.
        release: Takes the engine back when the session closes (its KV cache cleared).
        window: Most tokens of a row plus the answer (the backend's ``n_ctx``); None: cells only.
    """

    def __init__(
        self,
        backend: Forcer,
        engine: Engine,
        rows: Sequence[Sequence[int]],
        shared: int,
        request: ForcingRequest,
        *,
        top_k: int,
        with_original: bool,
        model_id: str,
        release: Callable[[Engine], None],
        window: int | None = None,
    ) -> None:
        super().__init__(backend, request, top_k=top_k)
        self._engine: Engine | None = engine
        self._with_original = with_original
        self._model_id = model_id
        self._release = release
        self._room = engine.n_ctx - cells(rows, shared, 0)
        self._window = window
        self._longest = max(len(row) for row in rows)
        self._pending = [int(row[-1]) for row in rows]
        """Each row's token not yet decoded (its logits predict the next answer token)."""
        self._position = [len(row) - 1 for row in rows]
        self._failed: BackendError | None = None
        prefix = [(list(rows[0][:shared]), list(range(len(rows))))] if shared else []
        heads = [Row(seq, row[shared:-1], shared) for seq, row in enumerate(rows)]
        try:
            if shared or any(row.tokens for row in heads):
                engine.decode(prefix, [row for row in heads if row.tokens])
        except BaseException:
            self.close()
            raise

    @property
    def incremental(self) -> bool:
        """True: a call decodes only its own tokens."""
        return True

    def _force(self, start: int) -> Forced | BackendError:
        """Decode the new tokens in every row; their top-k."""
        if self._failed is not None:
            return self._failed
        if self._engine is None:  # pragma: no cover - extend refuses a closed session
            msg = "the forcing session's context is closed"
            raise BackendError(msg)
        new = self.answer_ids[start:]
        rows = len(self._pending)
        longest = self._longest + len(self.answer_ids)
        if self._window is not None and longest > self._window:
            self._failed = ContextLengthError(
                f"a variant plus the answer has {longest} tokens; the backend's context "
                f"holds {self._window} (n_ctx)"
            )
            return self._failed
        if rows * len(self.answer_ids) > self._room:
            self._failed = ContextLengthError(
                f"the answer's {len(self.answer_ids)} tokens in {rows} rows do not fit "
                f"the forcing session's {self._engine.n_ctx} cells"
            )
            return self._failed
        try:
            tops = self._decode(self._engine, new)
        except BackendError as exc:
            self._failed = exc
            return exc
        return forced(tops, {}, self.request, self._with_original, self._model_id)

    def _decode(self, engine: Engine, new: Sequence[int]) -> list[tuple[Any, Any]]:
        """Every row's logits at the new positions, reduced; as many rows a decode as fit."""
        size = len(new)
        per_decode = max(engine.n_ctx // size, 1)
        tops = []
        seqs = list(range(len(self._pending)))
        for first in range(0, len(seqs), per_decode):
            group = seqs[first : first + per_decode]
            batch = [
                Row(seq, [self._pending[seq], *new[:-1]], self._position[seq], range(size))
                for seq in group
            ]
            logits = engine.decode([], batch)
            tops += [topk_rows(logits[i * size : (i + 1) * size], self.top_k)
                     for i in range(len(group))]  # fmt: skip
        for seq in seqs:
            self._pending[seq] = int(new[-1])
            self._position[seq] += size
        return tops

    def close(self) -> None:
        """Give the context back (its KV cache emptied)."""
        super().close()
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.clear()
            self._release(engine)
