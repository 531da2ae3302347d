"""The one small interface every backend implements.

``generate`` gives greedy answers with the original top-k per answer position; ``teacher_force``
forces them after each intervened prompt. White-box backends (``values_kind = "logits"``, e.g.
:class:`~esi_guard.HFBackend`) return raw logits, black-box ones (``"logprobs"``, OpenAI-style
servers) log-probabilities. Types: :mod:`._types`; shared engine code: :mod:`._engine_helpers`.
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
    """The engine whose states a backend on ``engine`` reads (``llamacpp-f16``: ``llamacpp``'s)."""
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
        """What computes the distributions: ``transformers``, ``llamacpp``, ``openai``, ``fake``...

        Recorded in threshold files: the same weights on another engine score close, not equal.
        """
        return _ENGINES.get(self.provider, self.provider)

    @property
    def model_sha256(self) -> str | None:
        """The one weights file's sha256 (a GGUF), matched before ``model_id``; None: unknown."""
        return None

    @property
    def hidden_layers(self) -> tuple[int, ...] | None:
        """Layers ``hidden=`` can return (:data:`FINAL` among them); None: none (API backends)."""
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

        An answer ends before the first ``stop`` sequence in it (``finish_reason="stop"``).
        ``hidden``: also each answer's states (``Generation.hidden``) from the same passes; a
        backend without them raises :class:`ConfigurationError`. A failed prompt (e.g. an API
        request after its retries) gets a :class:`BackendError` in place; a failed pass is raised.
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
        """Text of answer tokens (scores per sentence need it); None: cannot say (the default)."""
        return None

    def token_offsets(self, ids: Sequence[int], text: str) -> list[int] | None:
        """Each answer token's end offset in ``text``, the answer they decode to.

        None (no scores per sentence) when the backend cannot decode or ``text`` is not theirs.
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
        """One prompt's answer as text pieces, then its :class:`Generation` (or its error).

        The pieces join to its ``text``. Default: one piece, after :meth:`stream_tokens`.
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

        Lets sentences be scored as the answer streams. Default: one piece after :meth:`generate`.
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

        ``request`` has no answer yet; each ``extend`` adds tokens and gets their distributions as
        :meth:`teacher_force` of the whole answer would. ``max_answer_tokens``: the longest the
        answer will grow (a backend may size its state by it). Default: re-force it each time.
        """
        del max_answer_tokens
        return ForcingSession(self, request, top_k=top_k)

    async def ateacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> Sequence[Forced | BackendError]:
        """Async :meth:`teacher_force`; a worker thread by default."""
        return await asyncio.to_thread(self.teacher_force, requests, top_k=top_k)
