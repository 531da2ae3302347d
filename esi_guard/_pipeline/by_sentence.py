"""Scored streaming by sentence: each sentence scored as soon as its tokens are in.

:func:`stream` makes the variants first and opens a forcing session on them
(:meth:`~esi_guard.backends.base.Backend.open_forcing`) in a worker thread while the answer is
generated token by token. Each complete sentence
(:class:`~esi_guard.backends._engine_helpers.StreamedText`) is forced through the session and the
answer so far scored as a whole answer is (:func:`~esi_guard._pipeline.decide.scored`), then
yielded, judged. The final outcome is a non-streamed call's, up to the engine's rounding. Fails
closed: a sentence whose forcing or scoring failed is never yielded, nor any after it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from esi_guard._pipeline.decide import scored
from esi_guard._pipeline.items import Item
from esi_guard._pipeline.steps import Pipeline, StepHook, sent, shield, streamed
from esi_guard.backends._engine_helpers import StreamedText
from esi_guard.backends._session import ForcingSession, joined
from esi_guard.backends._types import AnswerPiece, Forced, ForcingRequest, Generation
from esi_guard.exceptions import BackendError, ConfigurationError, InputError
from esi_guard.result import Action, ESIResult
from esi_guard.scoring import TopK
from esi_guard.sentences import SentenceScore, score_sentences

__all__ = ["Growing", "shown", "stream"]

_BOUNDARY = re.compile(r"[.!?;:\u2026\u3002][^\s]*\s+\S|\n\s*\S")
"""Where a sentence may end and the next begin: end punctuation or a line break, space, a character.
A quick filter only (the splitter decides): splitting at every token would be quadratic."""


@dataclass
class Growing:
    """One answer while it streams: its tokens, and what of it was forced and scored."""

    text: StreamedText
    """Its text so far, never ahead of the final answer (``text.sent``)."""
    ids: list[int] = field(default_factory=list)
    rows: list[TopK] = field(default_factory=list)
    """The original top-k of each piece."""
    forced: list[Forced] = field(default_factory=list)
    """The session's pieces, in order."""
    n_forced: int = 0
    """Tokens forced so far."""
    text_forced: int = 0
    """Characters of ``text.sent`` whose tokens were forced."""
    scored: int = 0
    """Sentences scored (and yielded) so far."""
    scored_end: int = 0
    """Where the last of them ends in ``text.sent``."""
    failed: bool = False
    """A forcing or scoring failed: nothing more is yielded before the end."""

    def add(self, piece: AnswerPiece) -> None:
        """Take the next tokens."""
        self.ids += piece.token_ids
        self.rows.append(piece.topk)
        self.text.add(piece.token_ids)

    def original(self, length: int) -> TopK:
        """The first ``length`` positions' original top-k."""
        ids = np.concatenate([row.ids for row in self.rows])[:length]
        return TopK(ids, np.concatenate([row.values for row in self.rows])[:length])


def shown(
    sentences: Iterable[SentenceScore], action: Action
) -> Generator[SentenceScore, None, None]:
    """The judged sentences a stream shows, in order; the rest are withheld.

    Past the threshold, ``redact`` drops the sentence and goes on; other actions withhold it and
    all after it. ``sentences`` is drained either way, so the answer is scored to its end.
    """
    withheld = False
    for sentence in sentences:
        if sentence.decision == "accept" and not withheld:
            yield sentence
        elif action != "redact":
            withheld = True


def stream(pipeline: Pipeline, item: Item, hook: StepHook) -> Generator[SentenceScore, None, None]:
    """Each sentence of ``item``'s answer, judged, once scored; then the item is decided.

    A driver of :meth:`Pipeline.steps <esi_guard._pipeline.steps.Pipeline.steps>`. The last
    sentences come after the whole answer was decided: they are the final result's own.
    """
    steps = pipeline.steps([item], variants_first=True)
    growing = Growing(StreamedText(_decoder(pipeline), pipeline.stop))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="esi-session") as pool:
        opening: Future[ForcingSession | None] | None = None
        try:
            work = next(steps, None)
            while work is not None:
                with hook(work.step, work.items):
                    if work.step == "generate":
                        # Force the variants while the answer starts: the first sentence
                        # then waits only for its own tokens.
                        opening = pool.submit(opened, pipeline, item)
                        done: list[Any] = [
                            (yield from _generated(pipeline, item, growing, opening))
                        ]
                    elif work.step == "score" and opening is not None:
                        done = _forced(pipeline, work.requests, opening.result(), growing)
                    else:
                        done = pipeline.do(work)
                    work = sent(steps, done)
        finally:
            if opening is not None:
                _close(opening)
    if isinstance(item.outcome, ESIResult):
        yield from item.outcome.sentences[growing.scored :]


def _generated(
    pipeline: Pipeline, item: Item, growing: Growing, opening: Future[ForcingSession | None]
) -> Generator[SentenceScore, None, Generation | BackendError]:
    """The answer generated token by token, each sentence yielded once scored; its Generation."""
    tokens = pipeline.backend.stream_tokens(item.prompt.messages, **pipeline.stream_args())
    pieces = streamed(tokens)
    while True:
        try:
            piece = next(pieces)
        except StopIteration as end:
            return cast(Generation | BackendError, end.value)
        growing.add(piece)
        if not growing.failed and _may_end(growing):
            session = opening.result()
            if session is not None:
                yield from _complete(pipeline, item, session, growing)


def _may_end(growing: Growing) -> bool:
    """Whether a sentence may have ended since the last one scored (a quick filter)."""
    return _BOUNDARY.search(growing.text.sent, growing.scored_end) is not None


def _close(opening: Future[ForcingSession | None]) -> None:
    """Close the session once it is open (an opening that failed has nothing to close)."""
    try:
        session = opening.result()
    except Exception:  # raised to the caller where it was needed; nothing to close
        return
    if session is not None:
        session.close()


def opened(pipeline: Pipeline, item: Item) -> ForcingSession | None:
    """The variants' forcing session; None: none to force, or it failed (sentences come last)."""
    if item.outcome is not None or not item.changed:
        return None
    request = ForcingRequest(
        prompt=item.prompt.messages,
        variants=[item.prompt.with_question(text) for text in item.changed],
        answer_ids=[],
    )
    config = pipeline.config
    try:
        return pipeline.backend.open_forcing(request, top_k=config.top_k,
                                             max_answer_tokens=config.max_new_tokens)  # fmt: skip
    except (ConfigurationError, InputError):
        raise
    except Exception:  # the engine failed: force the whole answer at the end
        return None


def _decoder(pipeline: Pipeline) -> Callable[[Sequence[int]], str]:
    backend = pipeline.backend
    return lambda ids: backend.decode(ids) or ""


def _extend(session: ForcingSession, ids: Sequence[int], text: str) -> Forced | None:
    """The session's next piece; None where it failed (the sentence is not shown)."""
    try:
        out = session.extend(ids, text)
    except (ConfigurationError, InputError):
        raise
    except Exception:  # the engine failed: fail closed
        return None
    return out if isinstance(out, Forced) else None


def _complete(
    pipeline: Pipeline, item: Item, session: ForcingSession, growing: Growing
) -> Iterator[SentenceScore]:
    """The sentences the answer so far shows complete and that were not yet yielded."""
    text = growing.text.sent
    if not _may_end(growing):  # no sentence can have ended yet
        return
    ends = pipeline.backend.token_offsets(growing.ids, text)
    if ends is None:
        return
    zeros = np.zeros(len(ends))
    layout = score_sentences(text, ends, zeros, zeros, zeros)[:-1]  # the last may go on
    if len(layout) <= growing.scored:
        return
    end, n = layout[-1].end, layout[-1].end_token
    if n > growing.n_forced:
        out = _extend(session, growing.ids[growing.n_forced : n], text[growing.text_forced : end])
        if out is None:
            growing.failed = True
            return
        growing.forced.append(out)
        growing.n_forced, growing.text_forced = n, end
    prefix = replace(
        item, answer=text[:end], answer_ids=tuple(growing.ids[:n]), original=growing.original(n),
        token_ends=[min(e, end) for e in ends[:n]], outcome=None, steps={},
    )  # fmt: skip
    result = scored(prefix, joined(growing.forced, n), pipeline.rule,
                    pipeline.backend.values_kind)  # fmt: skip
    if not result.scored or len(result.sentences) < len(layout):
        growing.failed = True
        return
    yield from result.sentences[growing.scored : len(layout)]
    growing.scored, growing.scored_end = len(layout), end


def _forced(
    pipeline: Pipeline,
    requests: Sequence[ForcingRequest],
    session: ForcingSession | None,
    growing: Growing,
) -> list[Forced | BackendError]:
    """The forced rows of ``requests``: the first from the session where it can, else anew."""
    main: Forced | None = None
    if session is not None and requests and not growing.failed:
        ids, answer = requests[0].answer_ids, requests[0].answer or ""
        if growing.ids[: growing.n_forced] == ids[: growing.n_forced]:
            rest = ids[growing.n_forced :]
            out = _extend(session, rest, answer[growing.text_forced :]) if rest else None
            if out is not None:
                growing.forced.append(out)
            if growing.forced and (out is not None or not rest):
                main = joined(growing.forced, len(ids))
    call = pipeline.backend.teacher_force
    top_k = pipeline.config.top_k
    todo = list(requests) if main is None else list(requests[1:])
    forced = shield(lambda: call(todo, top_k=top_k), len(todo), "teacher_force") if todo else []
    return [main, *forced] if main is not None else forced
