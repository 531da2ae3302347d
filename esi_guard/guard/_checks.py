"""A guard's settings checked together, in one place; a :class:`ConfigurationError` says why.

``GuardFields._check`` (:mod:`esi_guard.guard._fields`) calls :func:`checked` after pydantic's
per-field checks; it returns the cascade for the policy. What the policy's stages may be together
is :class:`~esi_guard.policy.Policy`'s own rule.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Protocol

from esi_guard._retired import retired
from esi_guard.backends.base import states_engine
from esi_guard.backends.hidden import merged
from esi_guard.calibration.cascade_fit import label_free_band
from esi_guard.cascade import Band, Cascade, ESIProbe
from esi_guard.exceptions import ConfigurationError
from esi_guard.guard._config import model_difference
from esi_guard.scoring import DISTANCE_BOUNDS

if TYPE_CHECKING:
    from esi_guard.backends.base import Backend
    from esi_guard.backends.hidden import HiddenSpec
    from esi_guard.combined import CombinedScore
    from esi_guard.result import ScoringConfig

__all__ = ["Settings", "check_hidden", "checked", "probe_cascade", "score_range"]


class Settings(Protocol):
    """The guard's fields the checks read (read-only: a guard's narrower types fit)."""

    # fmt: off
    @property
    def backend(self) -> Backend: ...
    @property
    def threshold(self) -> float: ...
    @property
    def distance(self) -> str: ...
    @property
    def top_k(self) -> int: ...
    @property
    def support(self) -> str: ...
    @property
    def scoring_config(self) -> ScoringConfig: ...
    @property
    def action(self) -> str: ...
    @property
    def fallback(self) -> object: ...
    @property
    def on_error(self) -> str: ...
    @property
    def decide_on(self) -> str: ...
    @property
    def stream_mode(self) -> str: ...
    @property
    def temperature(self) -> float | None: ...
    @property
    def sentence_threshold(self) -> float | None: ...
    @property
    def combined(self) -> CombinedScore | None: ...
    @property
    def hidden_states(self) -> HiddenSpec | None: ...
    @property
    def esi_probe(self) -> ESIProbe | None: ...
    @property
    def probe_band(self) -> Band | None: ...
    @property
    def probe_disagreement(self) -> float: ...
    @property
    def free_score(self) -> CombinedScore | None: ...
    # fmt: on


def checked(guard: Settings) -> Cascade | None:
    """Refuse settings that cannot work together; the cascade they describe (None: none)."""
    check_settings(guard)
    check_hidden(guard.backend, guard.combined, guard.hidden_states)
    return guard_cascade(guard)


def score_range(guard: Settings) -> tuple[float, float, str]:
    """The decision signal's range and name, for messages (ESI is at most ``ln(k) * max D``)."""
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
    """Refuse a sentence threshold out of range, and ``support="all"`` for a sentence stream."""
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


def probe_cascade(
    probe: ESIProbe,
    band: Band | None,
    *,
    backend: Backend,
    scoring: ScoringConfig,
    threshold: float,
    max_disagreement: float = 0.02,
) -> Cascade:
    """An ESI-probe cascade for these settings, or a ConfigurationError naming the misfit."""
    problems = []
    if (other := model_difference(probe, backend)) is not None:
        problems.append(other)
    if (
        probe.engine is not None
        and probe.hidden is not None
        and states_engine(probe.engine) != states_engine(backend.engine)
    ):
        problems.append(
            f"engine: the probe reads the {probe.engine} engine's hidden states and this "
            f"guard runs {backend.engine}, whose states of the same weights differ: distill "
            "on this engine"
        )
    if probe.scoring is not None:
        problems += probe.scoring.score_differences(scoring)
    if problems:
        msg = "the ESI probe does not match this guard (distilled vs given): " + "; ".join(problems)
        raise ConfigurationError(msg)
    band = band or label_free_band(probe, threshold, max_disagreement=max_disagreement)
    cascade = Cascade(probe=probe, band=band)
    needs = cascade.needs_hidden
    if needs is not None:
        try:
            backend.check_hidden(needs)
        except ConfigurationError as exc:
            msg = f"the ESI probe reads hidden states, which this backend cannot give: {exc}"
            raise ConfigurationError(msg) from exc
        width = backend.hidden_size
        hidden = probe.hidden
        if hidden is not None and width is not None and width != hidden.hidden_size:
            msg = (
                f"the ESI probe was distilled on states of width {hidden.hidden_size}; "
                f"{backend.model_id} gives {width}: another model"
            )
            raise ConfigurationError(msg)
    return cascade


def check_hidden(backend: Backend, combined: CombinedScore | None, keep: HiddenSpec | None) -> None:
    """The backend gives the hidden states the combined score's probe and ``keep`` read."""
    probe = None if combined is None else combined.hidden
    reads = merged(None if probe is None else probe.spec, keep)
    if reads is None:
        return
    try:
        backend.check_hidden(reads)
    except ConfigurationError as exc:
        what = "the combined score's hidden-state probe" if probe else "hidden_states"
        msg = f"{what} cannot be used with this backend: {exc}"
        raise ConfigurationError(msg) from exc
    size = backend.hidden_size
    if probe is not None and size is not None and size != probe.hidden_size:
        msg = (
            f"the hidden-state probe was fitted on states of width {probe.hidden_size}; "
            f"{backend.model_id} gives {size}: another model"
        )
        raise ConfigurationError(msg)


def guard_cascade(guard: Settings) -> Cascade | None:
    """The cascade (of either kind) an ``ESIGuard``'s fields describe; None: none."""
    combined = guard.combined
    if combined is not None and not combined.uses_esi and (guard.esi_probe or guard.free_score):
        msg = (
            "the combined score reads no ESI: a cascade (esi_probe, free_score) has no ESI to spare"
        )
        raise ConfigurationError(msg)
    if guard.free_score is not None:
        return _free_cascade(guard)
    if guard.esi_probe is None:
        if guard.probe_band is not None:
            msg = "probe_band needs an esi_probe (esi-guard distill writes one)"
            raise ConfigurationError(msg)
        return None
    if guard.decide_on != "esi":
        msg = "a cascade estimates ESI: decide_on must stay 'esi'"
        raise ConfigurationError(msg)
    if guard.combined is not None:
        error = retired("esi_probe_on_combined", "ESIGuard")
        raise error
    return probe_cascade(guard.esi_probe, guard.probe_band, backend=guard.backend,
                         scoring=guard.scoring_config, threshold=guard.threshold,
                         max_disagreement=guard.probe_disagreement)  # fmt: skip


def _free_cascade(guard: Settings) -> Cascade:
    """A value-of-information cascade: ``free_score`` outside ``probe_band``, else ESI."""
    free, band, combined = guard.free_score, guard.probe_band, guard.combined
    assert free is not None  # guard_cascade's
    if guard.esi_probe is not None:
        msg = "free_score and esi_probe are two cascades: give one"
        raise ConfigurationError(msg)
    if combined is None or band is None or "esi" in free.features:
        msg = (
            "free_score (a combined score without esi) needs combined (with esi) and the "
            "probe_band fitted for it: `esi-guard calibrate --score combined --cascade` writes "
            "all three into the threshold file"
        )
        raise ConfigurationError(msg)
    check_hidden(guard.backend, free, None)
    return Cascade(free=free, band=band, combined=combined)
