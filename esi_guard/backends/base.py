"""The one small interface every backend implements, and the types it exchanges.

A backend does two things for ESI:

1. ``generate``: the greedy answer to each prompt and, at each answer position, the
   top-k of the original distribution;
2. ``teacher_force``: for each request, the same answer forced after each intervened
   prompt, the top-k at each answer position (all of a request's variants in one pass).

White-box backends (``values_kind = "logits"``, e.g. :class:`~esi_guard.HFBackend`)
return raw logits; black-box ones (``"logprobs"``, OpenAI-compatible servers) return
log-probabilities. Prompts are plain chat messages (role + content), so backends
never see LangChain types.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, TypedDict, TypeVar, runtime_checkable

import numpy as np

from esi_guard.backends.hidden import (
    FINAL,
    POSITIONS,
    HiddenSpec,
    HiddenStates,
    reduce_hidden,
)
from esi_guard.exceptions import BackendError, ConfigurationError
from esi_guard.scoring import TopK, ValueKind

__all__ = [
    "FINAL",
    "POSITIONS",
    "Backend",
    "ChatMessage",
    "Forced",
    "ForcingRequest",
    "Generation",
    "HiddenSpec",
    "HiddenStates",
    "Messages",
    "Sample",
    "Sampler",
    "StreamedText",
    "check_sampling",
    "finish_greedy",
    "non_finite",
    "reduce_hidden",
    "shared_prefix",
    "stopped_length",
]

MIN_SHARED_PREFIX = 8
"""Shorter shared prefixes are not worth computing apart."""


Tok = TypeVar("Tok")


class ChatMessage(TypedDict):
    """One chat message, as chat templates and OpenAI-style APIs take it."""

    role: str
    content: str


Messages = Sequence[ChatMessage]
"""A prompt: the chat messages, the last of which the answer replies to."""


@dataclass(frozen=True)
class Generation:
    """A greedy answer and the original distributions at each of its tokens."""

    text: str
    """The decoded answer, special tokens removed."""
    token_ids: tuple[int, ...]
    """The answer's token ids, end-of-sequence excluded."""
    topk: TopK
    """Top-k of the original distribution at each answer position."""
    finish_reason: Literal["stop", "length"]
    """``stop``: an end-of-sequence token or a stop sequence ended it; ``length``:
    ``max_new_tokens`` did."""
    prompt_tokens: int | None = None
    """How many tokens the prompt took (the answer's usage), when the backend knows."""
    hidden: HiddenStates | None = None
    """The answer's hidden states, when ``generate`` was asked for them (``hidden=``)."""


@dataclass(frozen=True)
class Sample:
    """One sampled answer: its text and the model's log-probability of each of its tokens."""

    text: str
    token_logprobs: tuple[float, ...]
    tokens: tuple[str, ...] = ()
    """Each token's text, in order (for token-level SAR); empty when a backend gives none."""

    @property
    def logprob(self) -> float:
        """Log-probability of the whole answer."""
        return float(sum(self.token_logprobs))

    @property
    def mean_logprob(self) -> float:
        """Length-normalised log-probability."""
        return self.logprob / max(len(self.token_logprobs), 1)


@dataclass(frozen=True)
class ForcingRequest:
    """One answer to force after each of a prompt's variants."""

    prompt: Messages
    """The original prompt."""
    variants: Sequence[Messages]
    """The intervened prompts, same messages but the question."""
    answer_ids: Sequence[int]
    """The answer tokens to force."""
    answer: str = ""
    """The answer's text, for backends that send text (the API backend)."""
    include_original: bool = False
    """Also force the answer after the original prompt (to score an existing answer)."""
    hidden: HiddenSpec | None = None
    """With ``include_original``: also return the original row's hidden states."""


@dataclass(frozen=True)
class Forced:
    """Top-k distributions of a forced answer."""

    variants: list[TopK]
    """One per variant, in request order."""
    original: TopK | None = None
    """Under the original prompt, when the request asked for it."""
    observed: list[int] | None = None
    """Approximate backends: per variant, how many leading positions are exact (the rest
    score the distance's upper bound, see :func:`~esi_guard.esi_score`). ``None``: all."""
    hidden: HiddenStates | None = None
    """The original row's hidden states, when the request asked for them."""


_ENGINES = {"huggingface": "transformers"}


def states_engine(engine: str) -> str:
    """The engine whose hidden states a backend on ``engine`` reads.

    ``llamacpp-f16`` and ``llamacpp-f32`` force on a float copy of the weights but
    generate, and read the answer's states, on the file's own: their states are
    ``llamacpp``'s.
    """
    return engine.removesuffix("-f16").removesuffix("-f32")


class Backend(ABC):
    """Base class of all backends."""

    provider: ClassVar[str] = "unknown"
    """Who runs the model, as LangChain's tracing names it (``ls_provider``)."""
    values_kind: ClassVar[ValueKind] = "logits"
    """What top-k values are: ``logits`` (white-box) or ``logprobs`` (black-box)."""

    @property
    def approximate(self) -> bool:
        """True when the variants' distributions are not exact teacher forcing."""
        return False

    @property
    def engine(self) -> str:
        """What computes the distributions: ``transformers``, ``llamacpp``, ``openai``, ``fake``.

        Recorded in threshold files: the same weights on another engine give close but
        not identical scores.
        """
        return _ENGINES.get(self.provider, self.provider)

    @property
    def model_sha256(self) -> str | None:
        """The content digest of the model's weights file, where there is one file (a GGUF).

        Two backends with the same digest run the same weights however they were loaded,
        so a threshold file matches on it before ``model_id``. None: unknown.
        """
        return None

    @property
    def hidden_layers(self) -> tuple[int, ...] | None:
        """The layers whose states the backend can return (``hidden=``); None: none.

        :data:`FINAL` among them. API backends give none.
        """
        return None

    @property
    def hidden_size(self) -> int | None:
        """Width of the hidden states (``d_model``), where the backend gives them."""
        return None

    def check_hidden(self, spec: HiddenSpec | None) -> None:
        """A :class:`ConfigurationError` unless this backend can give ``spec``'s states."""
        if spec is None:
            return
        layers = self.hidden_layers
        if layers is None:
            msg = (
                f"{type(self).__name__} ({self.engine}) gives no hidden states, which a "
                "hidden-state probe needs: use a white-box backend (transformers or llama.cpp)"
            )
            raise ConfigurationError(msg)
        missing = [layer for layer in spec.layers if layer not in layers]
        if missing:
            blocks = [layer for layer in layers if layer != FINAL]
            msg = (
                f"{self.model_id} has no layers {missing}: its blocks are "
                f"{min(blocks)}..{max(blocks)}, and FINAL ({FINAL}) is the final norm's output"
            )
            raise ConfigurationError(msg)

    @property
    @abstractmethod
    def model_id(self) -> str:
        """Identity of the model, recorded with every result."""

    @abstractmethod
    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Sequence[Generation | BackendError]:
        """Greedy answers with the original top-k at each answer position.

        ``hidden``: also each answer's hidden states (``Generation.hidden``), read from
        the same forward passes; a backend that has none raises :class:`ConfigurationError`.

        An answer ends before the first of the ``stop`` sequences it would contain
        (``finish_reason="stop"``); its tokens, text and distributions are the stopped ones.

        An item may be a :class:`BackendError` instead: that prompt failed (e.g. an API
        request after its retries) and the others keep their results. A failure of the
        whole call (a forward pass) is raised.
        """

    @abstractmethod
    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """Top-k at each answer position of each request, under each of its variants.

        Per-item failures are returned in place, as in :meth:`generate`.
        """

    @abstractmethod
    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """Token ids of an answer the user already has, as the model would emit them."""

    async def agenerate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Sequence[Generation | BackendError]:
        """Async :meth:`generate`; a worker thread by default."""
        extra = {} if hidden is None else {"hidden": hidden}
        return await asyncio.to_thread(
            self.generate, prompts, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )

    def stream_generate(
        self,
        prompt: Messages,
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Generator[str | Generation | BackendError, None, None]:
        """One prompt's answer as text pieces while it is generated, then its Generation.

        The last item is the whole :class:`Generation` (or the prompt's error); the pieces
        join to its ``text``. By default the answer comes in one piece, after
        :meth:`generate`; backends that can stream override this.
        """
        extra = {} if hidden is None else {"hidden": hidden}
        (gen,) = self.generate(
            [prompt], max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )
        if isinstance(gen, Generation) and gen.text:
            yield gen.text
        yield gen

    async def astream_generate(
        self,
        prompt: Messages,
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> AsyncIterator[str | Generation | BackendError]:
        """Async :meth:`stream_generate`: each piece fetched in a worker thread."""
        extra = {} if hidden is None else {"hidden": hidden}
        pieces = self.stream_generate(
            prompt, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )
        done = object()
        try:
            while (piece := await asyncio.to_thread(next, pieces, done)) is not done:
                yield piece  # type: ignore[misc]
        finally:
            await asyncio.to_thread(pieces.close)

    async def ateacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """Async :meth:`teacher_force`; a worker thread by default."""
        return await asyncio.to_thread(self.teacher_force, requests, top_k=top_k)


def stopped_length(
    tokens: Sequence[Tok], decode: Callable[[Sequence[Tok]], str], stop: Sequence[str]
) -> int | None:
    """How many of ``tokens`` to keep so that the answer ends before the first stop sequence.

    ``None`` when no stop sequence occurs. Otherwise the longest prefix whose text does
    not reach the stop sequence (a token that holds the sequence's first characters goes
    with it), so the kept tokens, their text and their distributions stay aligned.
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


def make_sample(
    tokens: Sequence[Tok],
    logprobs: Sequence[float],
    *,
    decode: Callable[[Sequence[Tok]], str],
    stop: Sequence[str] = (),
) -> Sample:
    """A sampled answer's tokens (end-of-sequence already cut) made into a :class:`Sample`.

    The answer ends before the first stop sequence, as a greedy one does
    (:func:`stopped_length`), its log-probabilities and token texts cut with it.
    """
    kept = stopped_length(tokens, decode, stop)
    end = len(tokens) if kept is None else kept
    return Sample(
        text=decode(tokens[:end]).strip(),
        token_logprobs=tuple(float(lp) for lp in logprobs[:end]),
        tokens=tuple(decode([one]) for one in tokens[:end]),
    )


def shared_prefix(rows: Sequence[Sequence[int]], reuse: bool = True) -> int:
    """How many leading tokens all ``rows`` share and a backend computes once.

    Every row keeps at least its last prompt token (its logits predict the first answer
    token); a prefix shorter than :data:`MIN_SHARED_PREFIX`, one row, or ``reuse=False``
    gives 0.
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


def check_sampling(n: int, temperature: float) -> None:
    """A :class:`ConfigurationError` unless ``n >= 1`` and ``temperature > 0``."""
    if n < 1 or temperature <= 0:
        msg = f"sample needs n >= 1 and temperature > 0, got n={n}, temperature={temperature}"
        raise ConfigurationError(msg)


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

    The answer ends before the first end-of-sequence token, then before the first stop
    sequence (:func:`stopped_length`); non-finite values at the kept positions (or at
    the position that chose the end) make it a :class:`BackendError`.
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

    A piece is sent only once no later token can take it back: the newest token waits
    (a stop sequence may yet drop it), trailing whitespace waits (the answer is stripped),
    and so does text that could be the start of a stop sequence. :meth:`rest` gives what
    is left of the final answer, so the pieces always join to it.
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
        safe = self._decode(self._tokens[:-1])
        safe = safe.lstrip() if self._strip else safe
        for stop in self._stop:
            safe = safe.split(stop, 1)[0]
        safe = safe.rstrip() if self._strip else safe
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(safe)), 0, -1):
                if safe.endswith(stop[:size]):
                    safe = safe[:-size].rstrip() if self._strip else safe[:-size]
                    break
        if not safe.startswith(self.sent) or len(safe) <= len(self.sent):
            return ""
        piece, self.sent = safe[len(self.sent) :], safe
        return piece

    def rest(self, final: str) -> str:
        """What of the final answer has not been sent."""
        return final[len(self.sent) :] if final.startswith(self.sent) else final


@runtime_checkable
class Sampler(Protocol):
    """A backend that can also sample answers, for the sampling baselines (not for ESI).

    ESI needs only :class:`Backend`; semantic entropy, ROUGE-L similarity and SAR need
    ``n`` sampled answers per prompt as well. :class:`~esi_guard.HFBackend` implements it.
    """

    def sample(
        self,
        prompts: Sequence[Messages],
        *,
        n: int,
        temperature: float,
        max_new_tokens: int,
        seed: int = 0,
        stop: Sequence[str] = (),
    ) -> Sequence[list[Sample] | BackendError]:
        """``n`` sampled answers per prompt, each ending before the first of ``stop``.

        Token log-probabilities are the model's own (temperature 1), whatever
        ``temperature`` the sampling used.
        """
        ...
