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
    """Refuse what cannot decide on (or stream) sentences.

    That is ``action="redact"``, ``decide_on="sentences"`` and ``stream_mode="sentences"``.
    Sentences are scored on their own tokens' ESI: every answer must run ESI in full, so
    no cascade or combined score without ESI; and a hidden-state probe
    reads the whole answer, so no combined score with one. A stream scores each sentence
    before the answer's end, so a token's score may not depend on later tokens: no
    ``support="all"``.
    """
    if guard.sentence_threshold is not None:
        _check_range("sentence_threshold", guard.sentence_threshold, guard)
    streams = guard.stream_mode == "sentences"
    if guard.action != "redact" and guard.decide_on != "sentences" and not streams:
        return
    what = (
        "stream_mode='sentences'" if streams
        else "action='redact'" if guard.action == "redact" else "decide_on='sentences'"
    )  # fmt: skip
    combined = guard.combined
    reasons = {
        "an esi_probe cascade (it decides whole answers)": guard.esi_probe,
        "a value-of-information cascade (free_score)": guard.free_score,
        "a combined score with a hidden-state probe (it reads the whole answer)":
            getattr(combined, "hidden", None),
        "a combined score without ESI (sentences are scored on their ESI)":
            combined is not None and not getattr(combined, "uses_esi", True),
        "support='all' (a token's score would depend on the tokens after it)":
            streams and guard.support == "all",
    }  # fmt: skip
    for reason, setting in reasons.items():
        if setting is not None and setting is not False:
            msg = f"{what} decides on each sentence's ESI, which rules out {reason}"
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
