"""How a guard's settings are checked together; a :class:`ConfigurationError` says why.

:meth:`GuardFields._check <esi_guard.guard._fields.GuardFields>` runs the checks after pydantic has
validated each field alone; they read the settings only (:class:`Settings`).
"""

from __future__ import annotations

import math
from typing import Protocol

from esi_guard.exceptions import ConfigurationError
from esi_guard.scoring import DISTANCE_BOUNDS

__all__ = ["Settings", "check_settings", "score_range"]


class Settings(Protocol):
    """The guard's fields the rules read (read-only: a guard's narrower types fit)."""

    @property
    def threshold(self) -> float: ...
    @property
    def distance(self) -> str: ...
    @property
    def top_k(self) -> int: ...
    @property
    def decide_on(self) -> str: ...
    @property
    def combined(self) -> object: ...
    @property
    def action(self) -> str: ...
    @property
    def fallback(self) -> object: ...
    @property
    def stream_mode(self) -> str: ...
    @property
    def support(self) -> str: ...
    @property
    def on_error(self) -> str: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def sentence_threshold(self) -> float | None: ...
    @property
    def esi_probe(self) -> object: ...
    @property
    def free_score(self) -> object: ...


def score_range(guard: Settings) -> tuple[float, float, str]:
    """The values the guard's decision signal can take, and its name, for error messages.

    ESI is a mean of ``alpha_t * D`` with ``alpha_t`` the entropy (nats) of a top-k
    distribution, at most ``ln k``, so a bounded distance bounds the score by
    ``ln(k) * max D``; ``p_wrong`` is a probability.
    """
    if guard.combined is not None:
        return 0.0, 1.0, "a combined score's p_wrong"
    bound = DISTANCE_BOUNDS.get(guard.distance, math.inf)
    what = f"ESI scores with {guard.distance}, k={guard.top_k}"
    return 0.0, bound * math.log(max(guard.top_k, 2)), what


def _check_range(name: str, value: float, guard: Settings) -> None:
    if not math.isfinite(value):
        msg = f"{name} must be a finite number, got {value!r}"
        raise ConfigurationError(msg)
    low, high, what = score_range(guard)
    if not low <= value <= high:
        effect = "every answer would be untrusted" if value < low else "none would"
        msg = f"{name}={value!r} is outside the range of {what}, [{low:g}, {high:.4g}]: {effect}"
        raise ConfigurationError(msg)


def check_sentences(guard: Settings) -> None:
    """Refuse what cannot stream sentences, and a sentence threshold out of range.

    A stream scores each sentence before the answer's end, so a token's score may not
    depend on later tokens: no ``support="all"``. What a guard deciding on sentences may
    decide with (ESI alone: no cascade, no combined score without ESI or with a
    hidden-state probe) is its policy's one rule (:class:`~esi_guard.policy.Policy`).
    """
    if guard.sentence_threshold is not None:
        _check_range("sentence_threshold", guard.sentence_threshold, guard)
    if guard.stream_mode == "sentences" and guard.support == "all":
        msg = (
            "stream_mode='sentences' decides on each sentence's ESI, which rules out "
            "support='all' (a token's score would depend on the tokens after it)"
        )
        raise ConfigurationError(msg)


def check_settings(guard: Settings) -> None:
    """Refuse settings that cannot work together."""
    _check_range("threshold", guard.threshold, guard)
    check_sentences(guard)
    if guard.action == "route" and guard.fallback is None:
        msg = "action='route' needs a fallback runnable"
        raise ConfigurationError(msg)
    if guard.stream_mode == "live" and (guard.action != "flag" or guard.on_error == "abstain"):
        msg = (
            "stream_mode='live' shows the answer before it is scored, so it needs "
            f"action='flag' and on_error='flag' or 'raise' (got action={guard.action!r}, "
            f"on_error={guard.on_error!r}): an answer already shown cannot be withheld"
        )
        raise ConfigurationError(msg)
    if guard.temperature not in (None, 0):
        msg = f"ESI scores the greedy answer: temperature must be 0, got {guard.temperature}"
        raise ConfigurationError(msg)
