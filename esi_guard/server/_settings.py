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
    """Other names clients may send, listed after it by ``/v1/models``; any other is a 404."""
    threshold_source: str | None = None
    """Where the guard's threshold came from (file, command line, shipped), for the start-up log."""
    max_batch: int = Field(default=32, ge=1)
    """Most requests in one batched guard call (1: micro-batching off)."""
    batch_window_ms: float = Field(default=10.0, ge=0)
    """How long the first request of a batch waits for others, in milliseconds."""
    max_queue: int = Field(default=256, ge=1)
    """Most requests waiting for a batch; one more gets a 503 with ``Retry-After``."""
    slots: int = Field(default=1, ge=1)
    """Batched calls (and live streams) at once: 1 in process, more for a batching upstream."""
    api_key: SecretStr | None = None
    """If set, ``/v1/*`` needs ``Authorization: Bearer <key>`` (constant-time, never logged)."""
    max_body_bytes: int = Field(default=1_048_576, ge=1)
    """Larger request bodies get a 413."""
    log_prompts: bool = False
    """Log each prompt and answer (at INFO). Off: neither is ever logged."""
    warm_up: bool = True
    """Ask the model once at start; ``/health`` is ready once it answered."""
    retry_after: int = Field(default=1, ge=0)
    """Seconds a 503 tells the client to wait."""
