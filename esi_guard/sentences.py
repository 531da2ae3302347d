"""A score per sentence of a long answer, from the per-token work the guard already did.

A sentence's ESI is the mean of ``ESIResult.token_scores`` over its own tokens, on the whole
answer's scale; its free signals come from those tokens too. Sentences come from pysbd's
rule-based splitter (abbreviations, numbers, lists), not a regex, as spans partitioning the answer.
A token (:meth:`Backend.token_offsets <esi_guard.backends.base.Backend.token_offsets>`) belongs to
the sentence holding its first non-space character; a sentence without one joins the one before.
Pure: text and arrays in, :class:`SentenceScore` out; no model, HTTP or LangChain.
"""

from __future__ import annotations

import bisect
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

__all__ = ["SentenceScore", "score_sentences", "split_sentences", "token_sentences"]


@dataclass
class SentenceScore:
    """One sentence of an answer, its score and what the guard decided for it."""

    text: str
    """The sentence, with the whitespace that follows it in the answer."""
    start: int
    """Its first character's offset in the answer."""
    end: int
    """The offset just past it (the next sentence's ``start``)."""
    first_token: int
    """Its first answer token's index."""
    end_token: int
    """The index just past its last answer token."""
    score: float
    """The sentence's ESI: the mean of the answer's ``token_scores`` over its tokens."""
    signals: dict[str, float] = field(default_factory=dict)
    """Its free signals from its own tokens: ``nll``, ``entropy``, ``max_nll``."""
    decision: str = "accept"
    """``accept``, or past the threshold: ``redact`` under ``action="redact"``, else the guard's
    action (the whole answer's to take, unless the guard decides on sentences)."""
    p_wrong: float | None = None
    """With a combined score, the probability that the sentence is wrong, which decides it."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-serialisable copy (``p_wrong`` only where there is one)."""
        out: dict[str, Any] = {
            "text": self.text, "start": self.start, "end": self.end, "score": self.score,
            "decision": self.decision, "signals": dict(self.signals),
            "first_token": self.first_token, "end_token": self.end_token,
        }  # fmt: skip
        if self.p_wrong is not None:
            out["p_wrong"] = self.p_wrong
        return out


@lru_cache(maxsize=1)
def _segmenter() -> Any:
    try:
        # pysbd's regexes hold invalid escapes: compiled at import (pip --no-compile), Python
        # 3.12 warns, and under -W error the warning is a SyntaxError.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            import pysbd
    except ImportError as exc:  # pragma: no cover - a core dependency
        msg = "scores per sentence need pysbd: pip install pysbd"
        raise ImportError(msg) from exc
    return pysbd.Segmenter(language="en", clean=False, char_span=False)


def split_sentences(text: str) -> list[tuple[int, int]]:
    """The answer's sentences as ``(start, end)`` spans that partition ``text`` (none if blank)."""
    if not text.strip():
        return []
    starts: list[int] = []
    cursor = 0
    for sentence in _segmenter().segment(text):
        stripped = sentence.strip()
        if not stripped:
            continue
        found = text.find(stripped, cursor)
        if found < 0:  # pysbd returned text it changed: keep the spans found so far
            continue
        starts.append(found)
        cursor = found + len(stripped)
    if not starts:
        return [(0, len(text))]
    starts[0] = 0
    ends = [*starts[1:], len(text)]
    return list(zip(starts, ends, strict=True))


def token_sentences(
    text: str, spans: Sequence[tuple[int, int]], token_ends: Sequence[int]
) -> list[tuple[int, int]]:
    """Each span's answer tokens as ``(first_token, end_token)``; ``(0, 0)`` where it holds none."""
    starts = [start for start, _ in spans]
    owner: list[int] = []
    before = 0
    for end in token_ends:
        piece = text[before:end]
        lead = len(piece) - len(piece.lstrip())
        at = min(before + lead, max(end - 1, before))
        owner.append(max(bisect.bisect_right(starts, at) - 1, 0))
        before = max(before, end)
    return [(owner.index(n), len(owner) - owner[::-1].index(n)) if n in owner else (0, 0)
            for n in range(len(spans))]  # fmt: skip


def score_sentences(
    text: str,
    token_ends: Sequence[int],
    token_scores: Sequence[float] | np.ndarray,
    logprobs: Sequence[float] | np.ndarray,
    entropies: Sequence[float] | np.ndarray,
) -> list[SentenceScore]:
    """The answer's sentences, each scored on its own tokens (see the module docstring).

    Args:
        text: The answer.
        token_ends: Each answer token's end offset in ``text`` (non-decreasing).
        token_scores: Each token's ESI contribution (``ESIScore.token_scores``).
        logprobs: Each token's log-probability over its position's top-k.
        entropies: Each position's ``alpha_t`` (entropy of its truncated distribution).

    Returns:
        The sentences in order, ``accept`` till the guard decides; empty without sentence or token.
    """
    n = len(token_ends)
    if not (n == len(token_scores) == len(logprobs) == len(entropies)):
        msg = (
            f"per-token arrays of different lengths: {n} offsets, {len(token_scores)} "
            f"scores, {len(logprobs)} log-probabilities, {len(entropies)} entropies"
        )
        raise ValueError(msg)
    spans = split_sentences(text)
    if not spans or not n:
        return []
    ranges = token_sentences(text, spans, token_ends)
    merged: list[tuple[int, int, int, int]] = []  # start, end, first token, end token
    for (start, end), (first, stop) in zip(spans, ranges, strict=True):
        if first == stop and merged:  # no token of its own: joins the sentence before
            merged[-1] = (merged[-1][0], end, merged[-1][2], merged[-1][3])
        elif merged and merged[-1][2] == merged[-1][3]:  # the first had none: joins this
            merged[-1] = (merged[-1][0], end, first, stop)
        else:
            merged.append((start, end, first, stop))
    scores = np.asarray(token_scores, dtype=np.float64)
    nll = -np.asarray(logprobs, dtype=np.float64)
    alphas = np.asarray(entropies, dtype=np.float64)
    out = []
    for start, end, first, stop in merged:
        part = slice(first, stop)
        signals = {"nll": float(nll[part].sum()), "entropy": float(alphas[part].mean()),
                   "max_nll": float(nll[part].max())}  # fmt: skip
        out.append(SentenceScore(text[start:end], start, end, first, stop,
                                 float(scores[part].mean()), signals))  # fmt: skip
    return out
