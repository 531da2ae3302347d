"""The wire format of OpenAI-compatible servers: request arguments and response parsing.

Pure: no client, no I/O. Parsers read responses by attribute and raise :class:`~esi_guard.APIError`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Literal, TypeVar

import numpy as np

from esi_guard.backends._engine_helpers import stopped_length
from esi_guard.backends._types import Forced, ForcingRequest, Generation, Messages
from esi_guard.exceptions import APIError, BackendError, ConfigurationError
from esi_guard.scoring import TopK

T = TypeVar("T")

_PROBE_MESSAGES: list[dict[str, str]] = [
    {"role": "user", "content": "Count from one to thirty in digits, separated by commas."}
]
_PROBE_PREFIX = "1, 2, 3, 4, 5,"


class _Vocab:
    """Token string <-> id, consistent for the backend's lifetime."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._tokens: list[str] = []
        self._lock = threading.Lock()

    def ids(self, tokens: Sequence[str]) -> list[int]:
        with self._lock:
            out = []
            for token in tokens:
                if token not in self._ids:
                    self._ids[token] = len(self._tokens)
                    self._tokens.append(token)
                out.append(self._ids[token])
            return out

    def tokens(self, ids: Sequence[int]) -> list[str]:
        with self._lock:
            if any(not 0 <= i < len(self._tokens) for i in ids):
                msg = "answer token ids this backend never produced (encode the answer first)"
                raise ConfigurationError(msg)
            return [self._tokens[i] for i in ids]


# -- request arguments ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One API request: the endpoint and its arguments (without model and client options)."""

    endpoint: Literal["completions", "chat"]
    kwargs: dict[str, Any]


def _completion_args(prompt: str, max_tokens: int, top_k: int) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": top_k,
    }


def _echo_args(prompt: str, top_k: int) -> dict[str, Any]:
    # max_tokens=1, not 0: llama-cpp-python reads 0 as "no limit"; _locate drops the extra token.
    return {
        "prompt": prompt,
        "max_tokens": 1,
        "temperature": 0.0,
        "logprobs": top_k,
        "echo": True,
    }


def _chat_args(messages: Messages, max_tokens: int, top_k: int) -> dict[str, Any]:
    return {
        "messages": [dict(m) for m in messages],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": True,
        "top_logprobs": top_k,
    }


# -- response parsing -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Entries:
    """An echo response's logprob entries: token strings and top-k dicts (None at the start)."""

    tokens: list[str]
    top: list[dict[str, float] | None]


def _malformed(what: str) -> APIError:
    return APIError(f"malformed response: {what}")


def _first_choice(response: Any, *, chat: bool) -> Any:
    """The response's first choice, which must carry logprobs (``.content`` for chat)."""
    choices = getattr(response, "choices", None)
    if not choices:
        msg = "no choices"
        raise _malformed(msg)
    choice = choices[0]
    logprobs = getattr(choice, "logprobs", None)
    if logprobs is None or (chat and getattr(logprobs, "content", None) is None):
        where = "top_logprobs in chat" if chat else "logprobs on this endpoint"
        msg = f"the server returned no logprobs (does it support {where}?)"
        raise APIError(msg)
    return choice


def _completion_tokens(choice: Any) -> list[str]:
    tokens = getattr(choice.logprobs, "tokens", None)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        msg = "logprobs.tokens is not a list of strings"
        raise _malformed(msg)
    return tokens


def _row(top: Mapping[str, Any] | Any, where: str) -> dict[str, float]:
    if not isinstance(top, Mapping) or not top:
        msg = f"top_logprobs at {where} is not a non-empty mapping"
        raise _malformed(msg)
    row: dict[str, float] = {}
    for token, value in top.items():
        if not isinstance(value, int | float) or math.isnan(value) or value > 1e-6:
            msg = f"top_logprobs at {where} holds {value!r}, not a logprob"
            raise _malformed(msg)
        row[str(token)] = min(float(value), 0.0)
    return row


def _completion_top(choice: Any, n: int) -> list[dict[str, float]]:
    top = getattr(choice.logprobs, "top_logprobs", None)
    if not isinstance(top, list) or len(top) < n:
        msg = f"{len(top) if isinstance(top, list) else 'no'} top_logprobs for {n} tokens"
        raise APIError(msg)
    return [_row(top[t], f"position {t}") for t in range(n)]


def _echo_entries(choice: Any) -> _Entries:
    tokens = _completion_tokens(choice)
    top = getattr(choice.logprobs, "top_logprobs", None)
    if not isinstance(top, list) or len(top) != len(tokens):
        msg = "echo top_logprobs and tokens differ in length"
        raise _malformed(msg)
    rows = [None if row is None else _row(row, f"entry {i}") for i, row in enumerate(top)]
    return _Entries(tokens=tokens, top=rows)


def _chat_logprobs(choice: Any) -> tuple[list[str], list[dict[str, float]]]:
    tokens: list[str] = []
    rows: list[dict[str, float]] = []
    for t, item in enumerate(choice.logprobs.content):
        token = getattr(item, "token", None)
        alternatives = getattr(item, "top_logprobs", None)
        if not isinstance(token, str) or not isinstance(alternatives, list) or not alternatives:
            msg = f"chat logprobs at position {t} lack a token or top_logprobs"
            raise _malformed(msg)
        top: dict[str, float] = {}
        for alt in alternatives:  # keep the first (highest) of tokens that share a string
            top.setdefault(str(getattr(alt, "token", "")), getattr(alt, "logprob", math.nan))
        tokens.append(token)
        rows.append(_row(top, f"position {t}"))
    return tokens, rows


def _tail_text(choice: Any, sent: str) -> str:
    """The text the server generated after the echoed prompt (its one extra token)."""
    text = str(getattr(choice, "text", "") or "")
    return text[len(sent) :] if text.startswith(sent) else ""


def _locate(
    tokens: list[str], tail: str, *, pieces: list[str] | None = None, text: str = ""
) -> tuple[int, int]:
    """Entries ``[start, end)`` of an echo response holding the answer (``pieces`` or ``text``)."""
    drops = (1, 0) if tail and tokens and tokens[-1] == tail else (0, 1)
    for drop in drops:
        end = len(tokens) - drop
        if pieces is not None:
            start = end - len(pieces)
            if start >= 0 and list(map(_squash, tokens[start:end])) == list(map(_squash, pieces)):
                return start, end
            continue
        target, start, spelled = _squash(text), end, ""
        while start > 0 and len(_squash(spelled)) < len(target):
            start -= 1
            spelled = tokens[start] + spelled
        if start < end and _squash(spelled) == target:
            return start, end
    count = "" if pieces is None else f" as the {len(pieces)} tokens it was generated as"
    msg = (
        f"the echo response does not end with the answer{count} (the server tokenised it "
        "differently, or returned fewer positions than the answer)"
    )
    raise APIError(msg)


def _squash(text: str) -> str:
    """Text without whitespace: token strings may differ from the text in spaces only."""
    return "".join(text.split())


def _argmax(row: Mapping[str, float] | None) -> str | None:
    if not row:
        return None
    return max(row.items(), key=lambda item: item[1])[0]


def _echo_answer_rows(
    response: Any, prompt: str, pieces: list[str], alignment: str
) -> list[dict[str, float]]:
    """The answer's top-k rows in an echo of ``prompt`` (ending with the answer; ``alignment``)."""
    choice = _first_choice(response, chat=False)
    entries = _echo_entries(choice)
    start, end = _locate(entries.tokens, _tail_text(choice, prompt), pieces=pieces)
    shift = 1 if alignment == "next" else 0
    rows = entries.top[start - shift : end - shift]
    if start - shift < 0 or any(row is None for row in rows):
        msg = "the echo response has no logprobs at some answer positions"
        raise APIError(msg)
    return [row for row in rows if row is not None]


def _topk(rows: Sequence[Mapping[str, float]], vocab: _Vocab) -> TopK:
    """Rows of ``token -> logprob`` as a ragged TopK (highest first, padded with -1)."""
    width = max((len(row) for row in rows), default=1)
    ids = np.full((len(rows), width), -1, dtype=np.int64)
    values = np.zeros((len(rows), width), dtype=np.float64)
    for t, row in enumerate(rows):
        kept = sorted(((v, k) for k, v in row.items() if v > -math.inf), reverse=True)
        if not kept:
            msg = f"answer position {t} has no finite logprob"
            raise APIError(msg)
        ids[t, : len(kept)] = vocab.ids([k for _, k in kept])
        values[t, : len(kept)] = [v for v, _ in kept]
    return TopK(ids, values)


def _answer_tokens(response: Any, prompt: str, answer: str) -> list[str]:
    """The answer's token strings in an echo of ``prompt + answer`` (no logprobs needed)."""
    choice = _first_choice(response, chat=False)
    entries = _echo_entries(choice)
    start, end = _locate(entries.tokens, _tail_text(choice, prompt + answer), text=answer)
    return entries.tokens[start:end]


def _joined(tokens: Sequence[str]) -> str:
    return "".join(tokens)


def _guarded(parse: Callable[[Any], T], response: Any) -> T | BackendError:
    if isinstance(response, BackendError):
        return response
    try:
        return parse(response)
    except APIError as exc:
        return exc


def _parse_generation(
    response: Any, vocab: _Vocab, *, echo: bool, stop: Sequence[str] = ()
) -> Generation:
    """The answer, cut back to whole tokens before the one that held a stop sequence."""
    if echo:
        choice = _first_choice(response, chat=False)
        tokens = _completion_tokens(choice)
        rows = _completion_top(choice, len(tokens))
        text = str(choice.text or "")
    else:
        choice = _first_choice(response, chat=True)
        tokens, rows = _chat_logprobs(choice)
        text = str(choice.message.content or "")
    finish: Literal["stop", "length"] = "length" if choice.finish_reason == "length" else "stop"
    kept = stopped_length(tokens, _joined, stop) if finish == "stop" else None
    if kept is not None:
        tokens, rows, text = tokens[:kept], rows[:kept], "".join(tokens[:kept])
    return Generation(
        text=text,
        token_ids=tuple(vocab.ids(tokens)),
        topk=_topk(rows, vocab),
        finish_reason=finish,
        prompt_tokens=getattr(getattr(response, "usage", None), "prompt_tokens", None),
    )


def _parse_forced(
    requests: Sequence[ForcingRequest],
    plan: list[tuple[str, list[_Call]]],
    responses: list[Any],
    vocab: _Vocab,
    *,
    echo: bool,
    alignment: str,
) -> list[Forced | BackendError]:
    """Each request's :class:`Forced` from its calls' responses (a failure in place)."""
    out: list[Forced | BackendError] = []
    offset = 0
    for request, (answer, calls) in zip(requests, plan, strict=True):
        group = responses[offset : offset + len(calls)]
        offset += len(calls)
        failed = next((r for r in group if isinstance(r, BackendError)), None)
        if failed is not None:
            out.append(failed)
            continue
        try:
            out.append(
                _forced(request, answer, calls, group, vocab, echo=echo, alignment=alignment)
            )
        except APIError as exc:
            out.append(exc)
    return out


def _forced(
    request: ForcingRequest,
    answer: str,
    calls: list[_Call],
    group: list[Any],
    vocab: _Vocab,
    *,
    echo: bool,
    alignment: str,
) -> Forced:
    n = len(request.answer_ids)
    if echo:
        pieces = vocab.tokens(request.answer_ids)
        tops = [
            _topk(_echo_answer_rows(r, str(c.kwargs["prompt"]), pieces, alignment), vocab)
            for c, r in zip(calls, group, strict=True)
        ]
        original = tops.pop() if request.include_original else None
        return Forced(variants=tops, original=original)
    variants, observed = [], []
    answer_ids = list(request.answer_ids)
    for response in group:
        tokens, rows = _chat_logprobs(_first_choice(response, chat=True))
        ids = vocab.ids(tokens)
        agree = next((t for t in range(min(n, len(ids))) if ids[t] != answer_ids[t]), None)
        seen = min(n, len(ids)) if agree is None else agree + 1
        observed.append(seen)
        variants.append(_topk(rows[:seen] + [{"": 0.0}] * (n - seen), vocab))
    return Forced(variants=variants, observed=observed)


class _Streamed:
    """A streamed generation's chunks gathered into the shape of a whole response."""

    def __init__(self, *, chat: bool) -> None:
        self.chat = chat
        self.text = ""
        self.tokens: list[str] = []
        self.top: list[Any] = []
        self.content: list[Any] = []
        self.finish_reason: str | None = None
        self.usage: Any = None

    def add(self, chunk: Any) -> list[str]:
        """Take in one chunk; the strings of the tokens it adds."""
        self.usage = getattr(chunk, "usage", None) or self.usage
        choices = getattr(chunk, "choices", None) or []
        if not choices:
            return []
        choice = choices[0]
        self.finish_reason = getattr(choice, "finish_reason", None) or self.finish_reason
        logprobs = getattr(choice, "logprobs", None)
        if self.chat:
            self.text += str(getattr(choice.delta, "content", None) or "")
            new = list(getattr(logprobs, "content", None) or [])
            self.content += new
            return [str(getattr(item, "token", "")) for item in new]
        self.text += str(getattr(choice, "text", None) or "")
        tokens = list(getattr(logprobs, "tokens", None) or [])
        self.tokens += tokens
        self.top += list(getattr(logprobs, "top_logprobs", None) or [])
        return [str(t) for t in tokens]

    def response(self) -> Any:
        """The gathered answer as a (non-streamed) response object."""
        if self.chat:
            logprobs = SimpleNamespace(content=self.content)
            choice = SimpleNamespace(
                message=SimpleNamespace(content=self.text), logprobs=logprobs,
                finish_reason=self.finish_reason,
            )  # fmt: skip
        else:
            logprobs = SimpleNamespace(tokens=self.tokens, top_logprobs=self.top)
            choice = SimpleNamespace(
                text=self.text, logprobs=logprobs, finish_reason=self.finish_reason
            )
        return SimpleNamespace(choices=[choice], usage=self.usage)
