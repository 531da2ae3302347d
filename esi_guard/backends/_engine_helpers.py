"""What the engines' backends share, engine-free: answers cut at stop sequences, streamed text."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Sequence
from typing import Any, TypeVar

import numpy as np

from esi_guard.backends._types import AnswerPiece, Generation
from esi_guard.exceptions import BackendError
from esi_guard.scoring import TopK

__all__ = [
    "MIN_SHARED_PREFIX",
    "StreamedText",
    "finish_greedy",
    "non_finite",
    "shared_prefix",
    "stopped_length",
    "text_pieces",
    "token_offsets",
]

MIN_SHARED_PREFIX = 8
"""Shorter shared prefixes are not worth computing apart."""


Tok = TypeVar("Tok")


def stopped_length(
    tokens: Sequence[Tok], decode: Callable[[Sequence[Tok]], str], stop: Sequence[str]
) -> int | None:
    """How many ``tokens`` to keep to end before the first stop sequence; None: no stop occurs.

    A token holding the sequence's start is dropped too: tokens, text and distributions align.
    """
    stops = [s for s in stop if s]
    if not stops:
        return None
    for end in range(1, len(tokens) + 1):
        text = decode(tokens[:end])
        found = [text.find(s) for s in stops if s in text]
        if found:
            cut = text[: min(found)]
            keep = end - 1
            while keep > 0 and not cut.startswith(decode(tokens[:keep])):
                keep -= 1
            return keep
    return None


def shared_prefix(rows: Sequence[Sequence[int]], reuse: bool = True) -> int:
    """How many leading tokens all ``rows`` share and a backend computes once.

    Each row keeps its last prompt token (it predicts the first answer token); 0 for a prefix
    under :data:`MIN_SHARED_PREFIX`, one row, or ``reuse=False``.
    """
    if not reuse or len(rows) < 2:
        return 0
    limit = min(len(row) for row in rows) - 1
    length = 0
    for column in zip(*rows, strict=False):
        if length >= limit or any(token != column[0] for token in column[1:]):
            break
        length += 1
    return length if length >= MIN_SHARED_PREFIX else 0


def non_finite(model_id: str) -> BackendError:
    """The error of a request whose distributions hold NaN or infinite logits."""
    return BackendError(f"model {model_id!r} produced NaN or infinite logits")


def finish_greedy(
    tokens: Sequence[int],
    topk: TopK,
    *,
    is_end: Callable[[int], bool],
    decode: Callable[[Sequence[int]], str],
    stop: Sequence[str],
    prompt_tokens: int,
    model_id: str,
) -> Generation | BackendError:
    """A white-box backend's greedy tokens and their top-k made into a :class:`Generation`.

    Cut at the first end token, then stop sequence (:func:`stopped_length`); non-finite values
    at a kept position (or the one choosing the end) make it a :class:`BackendError`.
    """
    eos = next((t for t, token in enumerate(tokens) if is_end(token)), None)
    length = len(tokens) if eos is None else eos
    if not np.isfinite(topk.values[: length + 1]).all():
        return non_finite(model_id)
    kept = stopped_length(tokens[:length], decode, stop)
    stopped = eos is not None or kept is not None
    length = length if kept is None else kept
    answer = tuple(tokens[:length])
    return Generation(
        text=decode(answer).strip(),
        token_ids=answer,
        topk=TopK(topk.ids[:length], topk.values[:length]),
        finish_reason="stop" if stopped else "length",
        prompt_tokens=prompt_tokens,
    )


class StreamedText:
    """The text of an answer piece by piece as its tokens arrive, never ahead of the answer.

    A piece waits until no later token can take it back: the newest token (a stop sequence may
    drop it), trailing whitespace, and what may start a stop sequence. :meth:`rest` completes it.
    """

    def __init__(
        self, decode: Callable[[Sequence[Any]], str], stop: Sequence[str], *, strip: bool = True
    ) -> None:
        self._decode = decode
        self._stop = [s for s in stop if s]
        self._strip = strip
        self._tokens: list[Any] = []
        self.sent = ""
        """The text sent so far."""

    def add(self, tokens: Sequence[Any]) -> str:
        """The new piece of text these tokens make safe to send ("" when none)."""
        self._tokens.extend(tokens)
        held = self._tokens[:-1]
        text = self._decode(held)
        cut = len(text)  # where a stop sequence starts, or may start, in the held text
        for stop in self._stop:
            found = text.find(stop)
            cut = min(cut, found) if found >= 0 else cut
            for size in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:size]):
                    cut = min(cut, len(text) - size)
                    break
        safe = text
        if cut < len(text):  # whole tokens before it, as the final answer keeps them
            count = len(held)
            while count > 0 and not text[:cut].startswith(self._decode(held[:count])):
                count -= 1
            safe = self._decode(held[:count])
        safe = safe.strip() if self._strip else safe
        if not safe.startswith(self.sent) or len(safe) <= len(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent) :], safe
        return piece

    def rest(self, final: str) -> str:
        """What of the final answer has not been sent."""
        return final[len(self.sent) :] if final.startswith(self.sent) else final


def token_offsets(
    decode: Callable[[Sequence[int]], str], ids: Sequence[int], text: str
) -> list[int] | None:
    """Each of ``ids``' end offset in ``text`` (their decoded answer); None: ``text`` is not theirs.

    ``text`` may lack the tokens' leading space (a word-start marker): offsets shift to it.
    """
    full = decode(ids)
    shift = full.find(text) if text else 0
    if shift < 0:
        return None
    ends: list[int] = []
    last = 0
    for count in range(1, len(ids) + 1):
        last = min(max(last, len(decode(ids[:count])) - shift), len(text))
        ends.append(last)
    return ends


def text_pieces(
    items: Iterable[AnswerPiece | Generation | BackendError],
    decode: Callable[[Sequence[Any]], str],
    stop: Sequence[str],
) -> Generator[str | Generation | BackendError, None, None]:
    """A token stream (``stream_tokens``) as a text stream (``stream_generate``), result last."""
    text = StreamedText(decode, stop)
    for item in items:
        if isinstance(item, AnswerPiece):
            if piece := text.add(item.token_ids):
                yield piece
            continue
        if isinstance(item, Generation) and (rest := text.rest(item.text)):
            yield rest
        yield item
