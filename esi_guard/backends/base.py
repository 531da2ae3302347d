"""The one small interface every backend implements.

A backend does two things for ESI:

1. ``generate``: the greedy answer to each prompt and, at each answer position, the
   top-k of the original distribution;
2. ``teacher_force``: for each request, the same answer forced after each intervened
   prompt, the top-k at each answer position (all of a request's variants in one pass).

White-box backends (``values_kind = "logits"``, e.g. :class:`~esi_guard.HFBackend`)
return raw logits; black-box ones (``"logprobs"``, OpenAI-compatible servers) return
log-probabilities. The types they exchange are in :mod:`._types` (prompts are plain chat
messages, so backends never see LangChain types); what the engines share, in
:mod:`._engine_helpers`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Generator, Sequence
from typing import ClassVar

from esi_guard.backends._engine_helpers import token_offsets
from esi_guard.backends._session import ForcingSession
from esi_guard.backends._types import (
    AnswerPiece,
    Forced,
    ForcingRequest,
    Generation,
    Messages,
)
from esi_guard.backends.hidden import FINAL, HiddenSpec
from esi_guard.exceptions import BackendError, ConfigurationError
from esi_guard.scoring import ValueKind

__all__ = ["Backend", "states_engine"]

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

    def decode(self, ids: Sequence[int]) -> str | None:
        """The text of answer tokens; None where the backend cannot say (the default).

        Scores per sentence need it (:meth:`token_offsets`).
        """
        return None

    def token_offsets(self, ids: Sequence[int], text: str) -> list[int] | None:
        """Each answer token's end offset in ``text``, the answer they decode to.

        None when the backend cannot decode tokens or ``text`` is not theirs: the answer
        then has no scores per sentence.
        """
        if self.decode(ids[:0]) is None:
            return None
        return token_offsets(lambda part: self.decode(part) or "", ids, text)

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
        join to its ``text``. By default the answer comes in one piece, once
        :meth:`stream_tokens` gave its Generation; backends that can stream override this.
        """
        extra = {} if hidden is None else {"hidden": hidden}
        tokens = self.stream_tokens(
            prompt, max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )
        for item in tokens:
            if isinstance(item, Generation) and item.text:
                yield item.text
            if not isinstance(item, AnswerPiece):
                yield item

    def stream_tokens(
        self,
        prompt: Messages,
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Generator[AnswerPiece | Generation | BackendError, None, None]:
        """One prompt's answer as its tokens come (:class:`AnswerPiece`), then its Generation.

        What scoring by sentence while the answer streams needs (each sentence forced as
        soon as its tokens are in). By default the whole answer comes in one piece, after
        :meth:`generate`; backends that can stream override this.
        """
        extra = {} if hidden is None else {"hidden": hidden}
        (gen,) = self.generate(
            [prompt], max_new_tokens=max_new_tokens, top_k=top_k, stop=stop, **extra
        )
        if isinstance(gen, Generation) and gen.token_ids:
            yield AnswerPiece(gen.token_ids, gen.topk)
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

    def open_forcing(
        self, request: ForcingRequest, *, top_k: int, max_answer_tokens: int
    ) -> ForcingSession:
        """A session forcing ``request``'s answer as it grows (:class:`ForcingSession`).

        ``request`` has no answer yet; each ``extend`` gives the next tokens and gets
        their distributions under every variant (and the original where asked), as
        :meth:`teacher_force` of the whole answer would give them there.
        ``max_answer_tokens``: the longest the answer will grow (a backend may size its
        state by it). By default each ``extend`` re-forces the answer so far (correct,
        not incremental); a backend that can keep its rows' state overrides this.
        """
        del max_answer_tokens
        return ForcingSession(self, request, top_k=top_k)

    async def ateacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """Async :meth:`teacher_force`; a worker thread by default."""
        return await asyncio.to_thread(self.teacher_force, requests, top_k=top_k)
