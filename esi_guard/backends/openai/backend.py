"""``OpenAIBackend``: the Backend API on an OpenAI-compatible server; see the package docstring."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from esi_guard._keywords import strict_keywords
from esi_guard.backends._engine_helpers import StreamedText
from esi_guard.backends._identity import gguf_model_id
from esi_guard.backends._template import ChatTemplate, resolve_template
from esi_guard.backends._types import Forced, ForcingRequest, Generation, Messages
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import HiddenSpec
from esi_guard.backends.openai._negotiate import Alignment, Mode, _Negotiator
from esi_guard.backends.openai._transport import RequestStats, _mapped, _Transport
from esi_guard.backends.openai._wire import (
    _answer_tokens,
    _Call,
    _chat_args,
    _completion_args,
    _echo_args,
    _guarded,
    _joined,
    _parse_forced,
    _parse_generation,
    _Streamed,
    _Vocab,
)
from esi_guard.exceptions import APIError, BackendError, ConfigurationError

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIBackend"]

T = TypeVar("T")


class _Kept(Generic[T]):
    """A backend attribute that one of its parts keeps: reads and writes go to that part."""

    def __init__(self, part: str) -> None:
        self._part = part
        self._name = ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> _Kept[T]: ...
    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None) -> T: ...
    def __get__(self, obj: object | None, owner: type[Any] | None = None) -> _Kept[T] | T:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self._part), self._name)
        return value

    def __set__(self, obj: object, value: T) -> None:
        setattr(getattr(obj, self._part), self._name, value)


class OpenAIBackend(Backend):
    """A backend on any OpenAI-compatible server: OpenAI, vLLM, llama.cpp, hosted providers.

    Args:
        model: The model name the server knows (llama-cpp-python: the path it was started with;
            a local ``.gguf`` path also gives echo mode its chat template).
        base_url: The server's ``/v1`` URL; ``None`` is OpenAI's (or ``OPENAI_BASE_URL``).
        api_key: The key; ``None`` reads ``OPENAI_API_KEY``, else ``"EMPTY"``. Never logged.
        mode: ``"echo"``, ``"chat"`` or ``"auto"`` (see the module docs).
        chat_template: Jinja source (or a ``ChatTemplate``) for echo mode. Default: from
            ``tokenizer``, else from ``model`` as a local ``.gguf``, folder or cached hub id.
        tokenizer: A tokenizer with ``apply_chat_template``, or its name/path.
        echo_alignment: ``"same"``, ``"next"`` or ``"auto"`` (see the module docs).
        timeout: Seconds before one HTTP attempt times out.
        max_retries: Retries of a retryable failure (so ``max_retries + 1`` attempts).
        retry_wait: Scale of the exponential jitter between attempts, in seconds.
        retry_max_wait: Longest wait between attempts, in seconds.
        max_concurrency: Most requests in flight at once, per backend.
        extra_body: Extra JSON fields sent with every request (server-specific options).
        client: A ready ``openai.OpenAI`` client (its own retries are turned off).
        async_client: A ready ``openai.AsyncOpenAI`` client.
        model_id: Identity recorded with results and matched by threshold files (default
            ``model``): one name for the same weights served under different names.

    Raises:
        ConfigurationError: On an invalid option, or ``mode="echo"`` without a template.
    """

    provider = "openai"
    values_kind = "logprobs"

    # Settings live in the part that uses them; reading or setting them here reaches it.
    model = _Kept[str]("_transport")
    base_url = _Kept[str | None]("_transport")
    timeout = _Kept[float]("_transport")
    max_retries = _Kept[int]("_transport")
    retry_wait = _Kept[float]("_transport")
    retry_max_wait = _Kept[float]("_transport")
    max_concurrency = _Kept[int]("_transport")
    extra_body = _Kept[dict[str, Any]]("_transport")
    stats = _Kept[RequestStats]("_transport")
    template = _Kept[ChatTemplate | None]("_negotiator")

    @strict_keywords
    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        mode: Mode = "auto",
        chat_template: str | ChatTemplate | None = None,
        tokenizer: Any = None,
        echo_alignment: Alignment = "auto",
        timeout: float = 60.0,
        max_retries: int = 3,
        retry_wait: float = 0.5,
        retry_max_wait: float = 8.0,
        max_concurrency: int = 8,
        extra_body: Mapping[str, Any] | None = None,
        client: openai.OpenAI | None = None,
        async_client: openai.AsyncOpenAI | None = None,
        model_id: str | None = None,
    ) -> None:
        if mode not in ("echo", "chat", "auto"):
            msg = f"mode must be 'echo', 'chat' or 'auto', got {mode!r}"
            raise ConfigurationError(msg)
        if echo_alignment not in ("auto", "same", "next"):
            msg = f"echo_alignment must be 'auto', 'same' or 'next', got {echo_alignment!r}"
            raise ConfigurationError(msg)
        if timeout <= 0 or max_retries < 0 or max_concurrency < 1 or retry_wait < 0:
            msg = (
                "need timeout > 0, max_retries >= 0, retry_wait >= 0 and max_concurrency >= 1; "
                f"got {timeout}, {max_retries}, {retry_wait}, {max_concurrency}"
            )
            raise ConfigurationError(msg)
        self._transport = _Transport(
            model,
            base_url=base_url,
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY",
            timeout=timeout,
            max_retries=max_retries,
            retry_wait=retry_wait,
            retry_max_wait=retry_max_wait,
            max_concurrency=max_concurrency,
            extra_body=extra_body,
            client=client,
            async_client=async_client,
        )
        template = resolve_template(model, chat_template, tokenizer)
        if mode == "echo" and template is None:
            msg = (
                f"echo mode needs the chat template of {model!r} to render prompts: pass "
                "chat_template=..., tokenizer=..., or a local .gguf path as model"
            )
            raise ConfigurationError(msg)
        self._negotiator = _Negotiator(self._transport, template, mode, echo_alignment)
        self._vocab = _Vocab()
        if model_id is None and model.endswith(".gguf") and os.path.isfile(model):
            model_id = gguf_model_id(model, model)  # the embedded file's one name
        self._model_id = model_id

    def close(self) -> None:
        """Close the sync HTTP client (one is made again if the backend is used later)."""
        self._transport.close()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, "
            f"mode={self.mode!r}, echo_alignment={self.echo_alignment!r})"
        )

    # -- identity and mode ------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        """The ``model_id`` given, else the model name the server knows."""
        return self._model_id or self.model

    @property
    def mode(self) -> Mode:
        """``echo`` or ``chat`` once resolved; ``auto`` until the first request probes."""
        return self._negotiator.mode

    @property
    def echo_alignment(self) -> Alignment:
        """``same`` or ``next`` once known; ``auto`` until probed."""
        return self._negotiator.alignment

    @property
    def approximate(self) -> bool:
        """True in chat mode (regenerations, not teacher forcing)."""
        return self._negotiator.resolve() == "chat"

    # -- Backend API ------------------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> list[Generation | BackendError]:
        """Greedy answers with top-k logprobs; ``hidden`` is a :class:`ConfigurationError`."""
        self.check_hidden(hidden)
        calls = self._generation_calls(prompts, max_new_tokens, top_k, stop)
        responses = self._transport.send_all(calls)
        parse = self._parser(stop)
        return [_guarded(parse, r) for r in responses]

    async def agenerate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> list[Generation | BackendError]:
        """Async :meth:`generate`, with the async client."""
        self.check_hidden(hidden)
        await self._negotiator.aresolve()
        calls = self._generation_calls(prompts, max_new_tokens, top_k, stop)
        responses = await self._transport.asend_all(calls)
        parse = self._parser(stop)
        return [_guarded(parse, r) for r in responses]

    def stream_generate(
        self,
        prompt: Messages,
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Generator[str | Generation | BackendError, None, None]:
        """The answer's text from the server's stream (with logprobs), then its Generation.

        Opening is retried; a stream broken off midway is the prompt's :class:`APIError`. Closing
        the iterator early closes the stream.
        """
        self.check_hidden(hidden)
        (call,) = self._generation_calls([prompt], max_new_tokens, top_k, stop)
        endpoint, args = call.endpoint, call.kwargs
        gathered = _Streamed(chat=endpoint == "chat")
        text = StreamedText(_joined, stop, strip=False)
        try:
            stream = self._transport.send(_Call(endpoint, {**args, "stream": True}))
        except APIError as exc:
            yield exc
            return
        try:
            for chunk in stream:
                if piece := text.add(gathered.add(chunk)):
                    yield piece
        except Exception as exc:  # the stream broke off: this prompt's failure
            yield _mapped(exc, self.timeout)
            return
        finally:
            getattr(stream, "close", lambda: None)()
        gen = _guarded(self._parser(stop), gathered.response())
        if isinstance(gen, Generation) and (rest := text.rest(gen.text)):
            yield rest
        yield gen

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Each request's answer under each of its variants (echo: exact; chat: approximate)."""
        plan = self._forcing_plan(requests, top_k)
        responses = self._transport.send_all([call for _, calls in plan for call in calls])
        return _parse_forced(requests, plan, responses, self._vocab, echo=self.mode == "echo",
                             alignment=self.echo_alignment)  # fmt: skip

    async def ateacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Async :meth:`teacher_force`, with the async client."""
        await self._negotiator.aresolve()
        plan = self._forcing_plan(requests, top_k)
        responses = await self._transport.asend_all([call for _, calls in plan for call in calls])
        return _parse_forced(requests, plan, responses, self._vocab, echo=self.mode == "echo",
                             alignment=self.echo_alignment)  # fmt: skip

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """The token strings behind ids this backend produced (e.g. a top-k row's ids)."""
        return self._vocab.tokens(ids)

    def decode(self, ids: Sequence[int]) -> str:
        """The answer text of ids this backend produced: their token strings joined."""
        return "".join(self.token_strings(ids))

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """Token ids of ``answer`` after ``prompt``, from an echo request (echo mode only)."""
        self._require_echo("scoring an answer it did not generate")
        text = self._render(prompt)
        response = self._transport.send(_Call("completions", _echo_args(text + answer, 1)))
        return self._vocab.ids(_answer_tokens(response, text, answer))

    # -- request building -------------------------------------------------------------------

    def _render(self, messages: Messages) -> str:
        assert self.template is not None
        return self.template.render(messages)

    def _require_echo(self, what: str) -> None:
        if self._negotiator.resolve() != "echo":
            msg = (
                f"{what} needs echo mode (teacher forcing); this backend is in chat mode "
                "(the server offers no echo logprobs, or no chat template is known)"
            )
            raise ConfigurationError(msg)

    def _generation_calls(
        self, prompts: Sequence[Messages], max_new_tokens: int, top_k: int, stop: Sequence[str]
    ) -> list[_Call]:
        extra = {"stop": list(stop)} if stop else {}
        if self._negotiator.resolve() == "echo":
            return [
                _Call(
                    "completions",
                    {**_completion_args(self._render(p), max_new_tokens, top_k), **extra},
                )
                for p in prompts
            ]
        return [_Call("chat", {**_chat_args(p, max_new_tokens, top_k), **extra}) for p in prompts]

    def _forcing_plan(
        self, requests: Sequence[ForcingRequest], top_k: int
    ) -> list[tuple[str, list[_Call]]]:
        """Per request: the answer text and its calls (variants first, then the original)."""
        mode = self._negotiator.resolve()
        plan = []
        for request in requests:
            answer = request.answer
            if not answer:
                msg = "the API backend needs the answer's text in ForcingRequest.answer"
                raise ConfigurationError(msg)
            prompts = [*request.variants]
            if request.include_original:
                self._require_echo("scoring an answer it did not generate")
                prompts.append(request.prompt)
            if mode == "echo":
                calls = [
                    _Call("completions", _echo_args(self._render(p) + answer, top_k))
                    for p in prompts
                ]
            else:
                n = len(request.answer_ids)
                calls = [_Call("chat", _chat_args(p, n, top_k)) for p in prompts]
            plan.append((answer, calls))
        return plan

    def _parser(self, stop: Sequence[str]) -> Callable[[Any], Generation]:
        """The parser of a generation's response, in the mode the request was sent in."""
        return functools.partial(
            _parse_generation, vocab=self._vocab, echo=self.mode == "echo", stop=stop
        )
