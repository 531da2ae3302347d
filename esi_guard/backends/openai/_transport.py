"""Sending requests to an OpenAI-compatible server: clients, retries, concurrency, errors.

What fails after retries becomes an :class:`~esi_guard.APIError` (or
:class:`~esi_guard.exceptions.APIContextLengthError`). The API key lives only in the SDK clients.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from esi_guard.backends.openai._wire import _Call
from esi_guard.exceptions import APIContextLengthError, APIError

if TYPE_CHECKING:
    import openai


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


class _Transport:
    """The clients of one backend and the sending of its requests, with retries."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str,
        timeout: float,
        max_retries: int,
        retry_wait: float,
        retry_max_wait: float,
        max_concurrency: int,
        extra_body: Mapping[str, Any] | None,
        client: openai.OpenAI | None,
        async_client: openai.AsyncOpenAI | None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout = timeout
        self.max_retries = max_retries
        self.retry_wait = retry_wait
        self.retry_max_wait = retry_max_wait
        self.max_concurrency = max_concurrency
        self.extra_body = dict(extra_body or {})
        self.stats = RequestStats()
        self._api_key = api_key
        self._client = client
        self._owns_client = client is None
        self._async_client = async_client
        self._semaphore = threading.BoundedSemaphore(max_concurrency)
        self._async_semaphores: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, asyncio.Semaphore
        ] = weakref.WeakKeyDictionary()

    def close(self) -> None:
        """Close the sync HTTP client (one is made again if the backend is used later)."""
        if self._client is not None and self._owns_client:
            self._client.close()
            self._client = None

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

    def send(self, call: _Call) -> Any:
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
        """Async :meth:`send`."""
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

    def send_all(self, calls: list[_Call]) -> list[Any]:
        """All calls, ``max_concurrency`` at a time; each item a response or its APIError."""

        def one(call: _Call) -> Any:
            try:
                return self.send(call)
            except APIError as exc:
                return exc

        if len(calls) <= 1:
            return [one(call) for call in calls]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(calls))) as pool:
            return list(pool.map(one, calls))

    async def asend_all(self, calls: list[_Call]) -> list[Any]:
        """Async :meth:`send_all`; cancelling it cancels every request in flight."""
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


# -- errors ---------------------------------------------------------------------------------


def _retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code == 429 or exc.status_code >= 500
    return False


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
        return APIContextLengthError(message, status_code=status, original=exc)
    return APIError(message, retryable=retryable, status_code=status, original=exc)
