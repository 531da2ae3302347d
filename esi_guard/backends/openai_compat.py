"""ESI from the top-k logprobs of OpenAI-compatible servers (OpenAI, vLLM, llama.cpp...).

Two ways to get the variants' distributions:

* **echo** (exact): the completions endpoint with ``echo=True`` and ``logprobs=k`` on the
  variant's prompt followed by the answer. The server scores the prompt it was sent, so the
  top-k at each answer position is true teacher forcing. Needs the model's chat template
  (to render the prompt as the model saw it) and a server that still offers echo.
* **chat** (approximate): the answer's own ``top_logprobs`` from the chat endpoint, and for
  each variant a greedy regeneration with ``top_logprobs``. While the variant's tokens agree
  with the answer's, the prefixes are the same, so each position up to and including the
  first disagreement is exact. After it the variant has left the answer: those positions
  score the distance's upper bound (1 for Hellinger), the most a distribution can move.
  Results say ``approximate: true``.

``mode="auto"`` probes the server once (an echo request) and remembers the answer.

Servers do not agree on where echo logprobs sit. OpenAI and vLLM put at entry ``i`` the
distribution that predicted token ``i`` (``echo_alignment="same"``); llama-cpp-python
0.3.x, on a prompt that does not start with its BOS token, puts there the distribution
*after* token ``i``, which predicts token ``i + 1`` (``"next"``). ``"auto"`` finds out once
per backend: it lets the server continue a counting prompt greedily, echoes it, and checks
which layout makes each greedy token the top-1 of its own distribution.

Token ids: APIs return token strings, so the backend gives each distinct string an id of
its own (consistent for the backend's lifetime). ESI only compares distributions at the
same position, so that is all it needs.

Failures: 429, 5xx, timeouts and connection errors are retried with exponential jitter
(tenacity, ``max_retries``); other 4xx are not. After that the request's prompt gets an
:class:`~esi_guard.APIError` (``retryable``, ``status_code``, ``original``) in place of its
result, and the rest of the batch keeps theirs. A response without logprobs, with fewer
positions than the answer or otherwise malformed is an ``APIError`` too, never a NaN score.
The API key lives only in the SDK clients: never in ``repr``, metadata, logs or callbacks.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from esi_guard.backends._template import ChatTemplate, resolve_template
from esi_guard.backends.base import Backend, Forced, ForcingRequest, Generation, Messages
from esi_guard.exceptions import APIError, BackendError, ConfigurationError, ContextLengthError
from esi_guard.scoring import TopK

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIBackend", "RequestStats"]

Mode = Literal["echo", "chat", "auto"]
Alignment = Literal["auto", "same", "next"]
T = TypeVar("T")

_PROBE_MESSAGES: list[dict[str, str]] = [
    {"role": "user", "content": "Count from one to thirty in digits, separated by commas."}
]
_PROBE_PREFIX = "1, 2, 3, 4, 5,"


@dataclass
class RequestStats:
    """Counters of what the backend sent, for monitoring and tests (thread-safe)."""

    requests: int = 0
    """HTTP attempts made, retries included."""
    retries: int = 0
    """Attempts that were retries of a failed one."""
    failures: int = 0
    """Requests that ended in an :class:`~esi_guard.APIError`."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str) -> None:
        """Count one event."""
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)


@dataclass(frozen=True)
class _Call:
    """One API request: the endpoint and its arguments (without model and client options)."""

    endpoint: Literal["completions", "chat"]
    kwargs: dict[str, Any]


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


class OpenAIBackend(Backend):
    """A backend on any OpenAI-compatible server: OpenAI, vLLM, llama.cpp, hosted providers.

    Args:
        model: The model name the server knows (for llama-cpp-python, the path it was
            started with; a local ``.gguf`` path also gives echo mode its chat template).
        base_url: The server's ``/v1`` URL; ``None`` is OpenAI's (or ``OPENAI_BASE_URL``).
        api_key: The key; ``None`` reads ``OPENAI_API_KEY``, else ``"EMPTY"`` (local
            servers ignore it). Never logged, never in results.
        mode: ``"echo"``, ``"chat"`` or ``"auto"`` (see the module docs).
        chat_template: Jinja source of the model's chat template (or a ``ChatTemplate``),
            for echo mode. Default: from ``tokenizer``, else from ``model`` when it names
            a local ``.gguf`` file, a local model folder or a hub id in the local cache.
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

    Raises:
        ConfigurationError: On an invalid option, or ``mode="echo"`` without a template.
    """

    values_kind = "logprobs"

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
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_wait = retry_wait
        self.retry_max_wait = retry_max_wait
        self.max_concurrency = max_concurrency
        self.extra_body = dict(extra_body or {})
        self.template = resolve_template(model, chat_template, tokenizer)
        if mode == "echo" and self.template is None:
            msg = (
                f"echo mode needs the chat template of {model!r} to render prompts: pass "
                "chat_template=..., tokenizer=..., or a local .gguf path as model"
            )
            raise ConfigurationError(msg)
        self._mode: Mode = mode
        self._alignment: Alignment = echo_alignment
        self._api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self._client = client
        self._owns_client = client is None
        self._async_client = async_client
        self._vocab = _Vocab()
        self._probe_lock = threading.Lock()
        self._semaphore = threading.BoundedSemaphore(max_concurrency)
        self._async_semaphores: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Semaphore
        ] = weakref.WeakKeyDictionary()
        self.stats = RequestStats()

    def close(self) -> None:
        """Close the sync HTTP client (one is made again if the backend is used later)."""
        if self._client is not None and self._owns_client:
            self._client.close()
            self._client = None

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"OpenAIBackend(model={self.model!r}, base_url={self.base_url!r}, "
            f"mode={self._mode!r}, echo_alignment={self._alignment!r})"
        )

    # -- identity and mode ------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        """The model name the server knows."""
        return self.model

    @property
    def mode(self) -> Mode:
        """``echo`` or ``chat`` once resolved; ``auto`` until the first request probes."""
        return self._mode

    @property
    def echo_alignment(self) -> Alignment:
        """``same`` or ``next`` once known; ``auto`` until probed."""
        return self._alignment

    @property
    def approximate(self) -> bool:
        """True in chat mode (regenerations, not teacher forcing)."""
        return self._resolve() == "chat"

    def _resolve(self) -> Literal["echo", "chat"]:
        """Settle ``auto`` mode and alignment, probing the server once.

        In ``auto`` mode a server that answers the echo probe with a client error or without
        logprobs gets chat mode; an unreachable or failing server (retryable errors) decides
        nothing: the error is raised and the next call probes again.
        """
        if self._mode == "chat" or (self._mode == "echo" and self._alignment != "auto"):
            return self._mode
        with self._probe_lock:
            if self._mode == "auto" and self.template is None:
                self._mode = "chat"
            if self._mode == "chat" or (self._mode == "echo" and self._alignment != "auto"):
                return self._mode
            try:
                detected = self._probe_alignment()
            except APIError as exc:
                if self._mode == "echo" or exc.retryable:
                    raise
                self._mode = "chat"
                return self._mode
            if self._alignment == "auto":
                self._alignment = detected
            self._mode = "echo"
            return self._mode

    def _probe_alignment(self) -> Alignment:
        """Continue a counting prompt greedily, echo it, and see which layout fits."""
        assert self.template is not None
        prompt = self.template.render(_PROBE_MESSAGES) + _PROBE_PREFIX  # type: ignore[arg-type]
        gen = self._send(_Call("completions", _completion_args(prompt, 12, 1)))
        answer = _first_choice(gen, chat=False)
        tokens = _completion_tokens(answer)
        text = "".join(tokens)
        if len(tokens) < 3:
            msg = "the alignment probe's continuation is too short to tell the layout"
            raise APIError(msg)
        probe = self._send(_Call("completions", _echo_args(prompt + text, 1)))
        echoed = _first_choice(probe, chat=False)
        entries = _echo_entries(echoed)
        start, end = _locate(entries.tokens, _tail_text(echoed, prompt + text), pieces=tokens)
        votes = {"same": 0, "next": 0}
        for i in range(start, end):
            token = entries.tokens[i]
            votes["same"] += _argmax(entries.top[i]) == token
            votes["next"] += i > 0 and _argmax(entries.top[i - 1]) == token
        best: Alignment = "same" if votes["same"] >= votes["next"] else "next"
        if votes[best] < 0.75 * len(tokens) or votes["same"] == votes["next"]:
            msg = (
                f"cannot tell the server's echo logprob layout (greedy tokens that are their "
                f"entry's top-1: same={votes['same']}, next={votes['next']} of {len(tokens)}); "
                "pass echo_alignment='same' or 'next'"
            )
            raise ConfigurationError(msg)
        return best

    # -- Backend API ------------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[Messages], *, max_new_tokens: int, top_k: int
    ) -> list[Generation | BackendError]:
        """Greedy answers with the top-k logprobs at each answer position."""
        calls = self._generation_calls(prompts, max_new_tokens, top_k)
        responses = self._send_all(calls)
        return [self._guarded(self._parse_generation, r) for r in responses]

    async def agenerate(
        self, prompts: Sequence[Messages], *, max_new_tokens: int, top_k: int
    ) -> list[Generation | BackendError]:
        """Async :meth:`generate`, with the async client."""
        await self._aresolve()
        calls = self._generation_calls(prompts, max_new_tokens, top_k)
        responses = await self._asend_all(calls)
        return [self._guarded(self._parse_generation, r) for r in responses]

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Each request's answer under each of its variants (echo: exact; chat: approximate)."""
        plan = self._forcing_plan(requests, top_k)
        responses = self._send_all([call for _, calls in plan for call in calls])
        return self._parse_forced(requests, plan, responses)

    async def ateacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Async :meth:`teacher_force`, with the async client."""
        await self._aresolve()
        plan = self._forcing_plan(requests, top_k)
        responses = await self._asend_all([call for _, calls in plan for call in calls])
        return self._parse_forced(requests, plan, responses)

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """The token strings behind ids this backend produced (e.g. a top-k row's ids)."""
        return self._vocab.tokens(ids)

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """Token ids of ``answer`` after ``prompt``, from an echo request (echo mode only)."""
        self._require_echo("scoring an answer it did not generate")
        text = self._render(prompt)
        response = self._send(_Call("completions", _echo_args(text + answer, 1)))
        choice = _first_choice(response, chat=False)
        entries = _echo_entries(choice)
        start, end = _locate(entries.tokens, _tail_text(choice, text + answer), text=answer)
        return self._vocab.ids(entries.tokens[start:end])

    # -- request building -------------------------------------------------------------------

    def _render(self, messages: Messages) -> str:
        assert self.template is not None
        return self.template.render(messages)

    def _require_echo(self, what: str) -> None:
        if self._resolve() != "echo":
            msg = (
                f"{what} needs echo mode (teacher forcing); this backend is in chat mode "
                "(the server offers no echo logprobs, or no chat template is known)"
            )
            raise ConfigurationError(msg)

    def _generation_calls(
        self, prompts: Sequence[Messages], max_new_tokens: int, top_k: int
    ) -> list[_Call]:
        if self._resolve() == "echo":
            return [
                _Call("completions", _completion_args(self._render(p), max_new_tokens, top_k))
                for p in prompts
            ]
        return [_Call("chat", _chat_args(p, max_new_tokens, top_k)) for p in prompts]

    def _forcing_plan(
        self, requests: Sequence[ForcingRequest], top_k: int
    ) -> list[tuple[str, list[_Call]]]:
        """Per request: the answer text and its calls (variants first, then the original)."""
        mode = self._resolve()
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

    # -- response parsing -------------------------------------------------------------------

    @staticmethod
    def _guarded(parse: Callable[[Any], T], response: Any) -> T | BackendError:
        if isinstance(response, BackendError):
            return response
        try:
            return parse(response)
        except APIError as exc:
            return exc

    def _parse_generation(self, response: Any) -> Generation:
        if self._mode == "echo":
            choice = _first_choice(response, chat=False)
            tokens = _completion_tokens(choice)
            rows = _completion_top(choice, len(tokens))
            text = str(choice.text or "")
        else:
            choice = _first_choice(response, chat=True)
            tokens, rows = _chat_logprobs(choice)
            text = str(choice.message.content or "")
        finish: Literal["stop", "length"] = "length" if choice.finish_reason == "length" else "stop"
        return Generation(
            text=text,
            token_ids=tuple(self._vocab.ids(tokens)),
            topk=self._topk(rows),
            finish_reason=finish,
        )

    def _parse_forced(
        self,
        requests: Sequence[ForcingRequest],
        plan: list[tuple[str, list[_Call]]],
        responses: list[Any],
    ) -> list[Forced | BackendError]:
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
                out.append(self._forced(request, answer, calls, group))
            except APIError as exc:
                out.append(exc)
        return out

    def _forced(
        self, request: ForcingRequest, answer: str, calls: list[_Call], group: list[Any]
    ) -> Forced:
        n = len(request.answer_ids)
        if self._mode == "echo":
            pieces = self._vocab.tokens(request.answer_ids)
            tops = [
                self._echo_answer_rows(r, str(c.kwargs["prompt"]), pieces)
                for c, r in zip(calls, group, strict=True)
            ]
            original = tops.pop() if request.include_original else None
            return Forced(variants=tops, original=original)
        variants, observed = [], []
        answer_ids = list(request.answer_ids)
        for response in group:
            tokens, rows = _chat_logprobs(_first_choice(response, chat=True))
            ids = self._vocab.ids(tokens)
            agree = next((t for t in range(min(n, len(ids))) if ids[t] != answer_ids[t]), None)
            seen = min(n, len(ids)) if agree is None else agree + 1
            observed.append(seen)
            variants.append(self._topk(rows[:seen] + [{"": 0.0}] * (n - seen)))
        return Forced(variants=variants, observed=observed)

    def _echo_answer_rows(self, response: Any, prompt: str, pieces: list[str]) -> TopK:
        choice = _first_choice(response, chat=False)
        entries = _echo_entries(choice)
        start, end = _locate(entries.tokens, _tail_text(choice, prompt), pieces=pieces)
        shift = 1 if self._alignment == "next" else 0
        rows = entries.top[start - shift : end - shift]
        if start - shift < 0 or any(row is None for row in rows):
            msg = "the echo response has no logprobs at some answer positions"
            raise APIError(msg)
        return self._topk([row for row in rows if row is not None])

    def _topk(self, rows: Sequence[Mapping[str, float]]) -> TopK:
        """Rows of ``token -> logprob`` as a ragged TopK (highest first, padded with -1)."""
        width = max((len(row) for row in rows), default=1)
        ids = np.full((len(rows), width), -1, dtype=np.int64)
        values = np.zeros((len(rows), width), dtype=np.float64)
        for t, row in enumerate(rows):
            kept = sorted(((v, k) for k, v in row.items() if v > -math.inf), reverse=True)
            if not kept:
                msg = f"answer position {t} has no finite logprob"
                raise APIError(msg)
            ids[t, : len(kept)] = self._vocab.ids([k for _, k in kept])
            values[t, : len(kept)] = [v for v, _ in kept]
        return TopK(ids, values)

    # -- transport --------------------------------------------------------------------------

    def _sync_client(self) -> openai.OpenAI:
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                base_url=self.base_url, api_key=self._api_key, timeout=self.timeout, max_retries=0
            )
        return self._client.with_options(max_retries=0, timeout=self.timeout)

    def _retry_options(self) -> dict[str, Any]:
        import tenacity

        return {
            "retry": tenacity.retry_if_exception(_retryable),
            "stop": tenacity.stop_after_attempt(self.max_retries + 1),
            "wait": tenacity.wait_random_exponential(
                multiplier=self.retry_wait, max=self.retry_max_wait
            ),
            "before_sleep": lambda _: self.stats.add("retries"),
            "reraise": True,
        }

    def _request_kwargs(self, call: _Call) -> dict[str, Any]:
        kwargs = {"model": self.model, **call.kwargs}
        if self.extra_body:
            kwargs["extra_body"] = self.extra_body
        return kwargs

    def _send(self, call: _Call) -> Any:
        """One request with retries; raises the mapped :class:`APIError`."""
        import tenacity

        client = self._sync_client()
        create: Callable[..., Any] = (
            client.completions.create
            if call.endpoint == "completions"
            else client.chat.completions.create
        )

        def attempt() -> Any:
            self.stats.add("requests")
            with self._semaphore:
                return create(**self._request_kwargs(call))

        try:
            return tenacity.Retrying(**self._retry_options())(attempt)
        except Exception as exc:
            self.stats.add("failures")
            raise _mapped(exc, self.timeout) from exc

    async def _asend(self, client: openai.AsyncOpenAI, call: _Call) -> Any:
        """Async :meth:`_send`."""
        import tenacity

        create: Callable[..., Any] = (
            client.completions.create
            if call.endpoint == "completions"
            else client.chat.completions.create
        )
        semaphore = self._async_semaphore()

        async def attempt() -> Any:
            self.stats.add("requests")
            async with semaphore:
                return await create(**self._request_kwargs(call))

        try:
            return await tenacity.AsyncRetrying(**self._retry_options())(attempt)
        except Exception as exc:
            self.stats.add("failures")
            raise _mapped(exc, self.timeout) from exc

    def _send_all(self, calls: list[_Call]) -> list[Any]:
        """All calls, ``max_concurrency`` at a time; each item a response or its APIError."""

        def one(call: _Call) -> Any:
            try:
                return self._send(call)
            except APIError as exc:
                return exc

        if len(calls) <= 1:
            return [one(call) for call in calls]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(calls))) as pool:
            return list(pool.map(one, calls))

    async def _asend_all(self, calls: list[_Call]) -> list[Any]:
        """Async :meth:`_send_all`; cancelling the caller cancels every request in flight.

        Without a client of the user's, each call opens and closes its own: an async
        client belongs to the event loop it was made in.
        """
        if self._async_client is not None:
            client = self._async_client.with_options(max_retries=0, timeout=self.timeout)
            return await self._agather(client, calls)
        import openai

        async with openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self._api_key, timeout=self.timeout, max_retries=0
        ) as client:
            return await self._agather(client, calls)

    async def _agather(self, client: openai.AsyncOpenAI, calls: list[_Call]) -> list[Any]:
        async def one(call: _Call) -> Any:
            try:
                return await self._asend(client, call)
            except APIError as exc:
                return exc

        return list(await asyncio.gather(*(one(call) for call in calls)))

    def _async_semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        semaphore = self._async_semaphores.get(loop)
        if semaphore is None:
            semaphore = asyncio.Semaphore(self.max_concurrency)
            self._async_semaphores[loop] = semaphore
        return semaphore

    async def _aresolve(self) -> None:
        if self._mode == "auto" or (self._mode == "echo" and self._alignment == "auto"):
            await asyncio.to_thread(self._resolve)


# -- pure helpers: request arguments ------------------------------------------------------


def _completion_args(prompt: str, max_tokens: int, top_k: int) -> dict[str, Any]:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "logprobs": top_k,
    }


def _echo_args(prompt: str, top_k: int) -> dict[str, Any]:
    # max_tokens=1, not 0: llama-cpp-python reads 0 as "no limit". The one extra token is
    # located and dropped by _locate.
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


# -- pure helpers: response parsing -------------------------------------------------------


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
    """Entries ``[start, end)`` of an echo response that hold the answer.

    The answer ends the prompt, so its entries end the list, or sit just before the one
    token the server generated when it lists that one too (``tail`` is that token's text).
    With the answer's token strings (``pieces``) known, the span must repeat them; with
    only its ``text``, entries are taken back from the end until they spell it.
    """
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


# -- errors --------------------------------------------------------------------------------


def _retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


class _ContextLengthAPIError(APIError, ContextLengthError):
    """A server's refusal of a prompt longer than its context: both errors at once."""


# How llama.cpp, vLLM and OpenAI word a prompt past the context window (HTTP 400).
_CONTEXT_WORDS = ("context window", "context length", "context_length", "maximum context")


def _mapped(exc: BaseException, timeout: float) -> APIError:
    """The project's error for an SDK (or parsing) failure; never includes the key."""
    import openai

    if isinstance(exc, APIError):
        return exc
    retryable = _retryable(exc)
    status = None
    if isinstance(exc, openai.APITimeoutError):
        message = f"the server did not answer within {timeout}s"
    elif isinstance(exc, openai.APIConnectionError):
        message = f"cannot reach the server: {exc}"
    elif isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = f"the server answered HTTP {status}: {exc.message}"
    elif isinstance(exc, openai.APIResponseValidationError | ValueError):
        message = f"malformed response: {exc}"
    else:
        message = f"request failed: {type(exc).__name__}: {exc}"
    if retryable:
        message += " (retries exhausted)"
    if status == 400 and any(word in message.lower() for word in _CONTEXT_WORDS):
        return _ContextLengthAPIError(message, status_code=status, original=exc)
    return APIError(message, retryable=retryable, status_code=status, original=exc)
