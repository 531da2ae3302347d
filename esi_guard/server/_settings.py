"""The server's own settings (the guard's are the guard's): one validated object."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["ServeSettings"]


class ServeSettings(BaseModel):
    """How the server batches, queues, limits and protects; ``esi-guard serve``'s flags."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_name: str | None = None
    """The model name clients send and ``/v1/models`` lists; default the backend's model id."""
    model_aliases: tuple[str, ...] = ()
    """Other names clients may send for the model, listed after it by ``/v1/models``
    (``esi-guard serve``, for a model in process: ``"default"`` for a path, else ``--model``
    as given); any other is a 404."""
    threshold_source: str | None = None
    """Where the guard's threshold came from (a file, the command line, the shipped file),
    for the start-up log line."""
    max_batch: int = Field(default=32, ge=1)
    """Most requests in one batched guard call (1: micro-batching off)."""
    batch_window_ms: float = Field(default=10.0, ge=0)
    """How long the first request of a batch waits for others, in milliseconds."""
    max_queue: int = Field(default=256, ge=1)
    """Most requests waiting for a batch; one more gets a 503 with ``Retry-After``."""
    slots: int = Field(default=1, ge=1)
    """Batched calls (and live streams) running at once: 1 for a model in process, more
    for an upstream server that batches on its own."""
    api_key: SecretStr | None = None
    """When set, ``/v1/*`` needs ``Authorization: Bearer <key>`` (compared in constant
    time, never logged)."""
    max_body_bytes: int = Field(default=1_048_576, ge=1)
    """Larger request bodies get a 413."""
    log_prompts: bool = False
    """Log each prompt and answer (at INFO). Off: neither is ever logged."""
    warm_up: bool = True
    """Ask the model once at start; ``/health`` is ready once it answered."""
    retry_after: int = Field(default=1, ge=0)
    """Seconds a 503 tells the client to wait."""
