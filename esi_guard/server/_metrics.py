"""The server's Prometheus metrics, in a registry of its own per app; docs/serve.md lists them."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["Metrics"]

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
_SCORES = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8, 1.0, 1.5, 2.0)


class Metrics:
    """Every metric of one server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("esi_guard_requests", "Requests by endpoint and HTTP status.",
                                ["endpoint", "status"], registry=r)  # fmt: skip
        self.decisions = Counter("esi_guard_decisions", "Answers by decision and reason.",
                                 ["decision", "reason"], registry=r)  # fmt: skip
        self.score = Histogram("esi_guard_score", "Scores of the scored answers.",
                               buckets=_SCORES, registry=r)  # fmt: skip
        self.steps = Histogram("esi_guard_step_seconds", "Seconds per step.", ["step"],
                               buckets=_SECONDS, registry=r)  # fmt: skip
        self.batch_size = Histogram("esi_guard_batch_size", "Requests per batched call.",
                                    buckets=_SIZES, registry=r)  # fmt: skip
        self._depth = Gauge("esi_guard_queue_depth", "Requests waiting for a batch.", registry=r)
        self.in_flight = Gauge("esi_guard_in_flight", "Chat requests being served.", registry=r)
        self.ready = Gauge("esi_guard_ready", "1 once the model has answered.", registry=r)

    def watch_queue(self, queue_depth: Callable[[], int]) -> None:
        """Read the queue depth from ``queue_depth`` at each scrape."""
        self._depth.set_function(lambda: float(queue_depth()))

    def decided(self, esi: dict[str, object]) -> None:
        """Count one answer's decision, and its score when scored."""
        why = esi.get("reason")
        code = "scored" if not why else str(why).partition(":")[0]
        self.decisions.labels(str(esi["decision"]), code).inc()
        score = esi.get("score")
        if esi.get("scored") and isinstance(score, (int, float)):
            self.score.observe(float(score))

    def batched(self, size: int, waits: list[float]) -> None:
        """One batched call of ``size`` requests, each having waited ``waits`` seconds."""
        self.batch_size.observe(size)
        for wait in waits:
            self.steps.labels("queue").observe(wait)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)
