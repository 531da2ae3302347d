"""ESI only where the decision needs it: a label-free ESI probe, and the cascade it drives.

An :class:`ESIProbe` estimates ESI from the answer's own pass (its
:func:`~esi_guard.combined.free_signals` and :class:`~esi_guard.backends.hidden.HiddenStates`): a
ridge regression fitted to the full-L ESI of *unlabelled* questions (``esi-guard distill``,
:func:`~esi_guard.calibration.cascade_fit.fit_esi_probe`), a dot product at run time. A
:class:`Cascade` decides on a cheap score (that estimate, or a combined score without ESI) outside
a band ``[low, high]`` (below: accept; above: the guard's action) and runs full ESI inside it. The
band is the threshold +- :attr:`ESIProbe.band` (no labels needed) or
:func:`~esi_guard.calibration.cascade_fit.fit_band`'s: the narrowest whose decisions differ from
full ESI's on at most ``max_disagreement`` of answers with confidence ``1 - delta``. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from esi_guard._files import read_model
from esi_guard._retired import retired
from esi_guard.backends.hidden import HiddenSpec, HiddenStates, merged
from esi_guard.combined import CombinedScore, HiddenProbe
from esi_guard.exceptions import ConfigurationError
from esi_guard.result import ScoringConfig

__all__ = [
    "ESI_PROBE_FORMAT",
    "PROBE_SIGNALS",
    "Band",
    "Cascade",
    "ESIProbe",
]

ESI_PROBE_FORMAT = "esi-guard/esi-probe"

PROBE_SIGNALS = ("nll", "entropy", "max_nll")
"""The free signals an ESI probe reads by default (ESI is entropy-weighted: they track it)."""


class ESIProbe(BaseModel):
    """``estimate = intercept + sum_i w_i * (signal_i - mean_i) / scale_i [+ v . states]``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["esi-guard/esi-probe"] = "esi-guard/esi-probe"
    version: Literal[1] = 1
    model: str = ""
    """The backend's ``model_id`` it was distilled on."""
    model_sha256: str | None = None
    """The weights' digest (a GGUF's) where the backend has one."""
    engine: str | None = None
    """The engine whose states it reads (``llamacpp``, ``transformers``)."""
    scoring: ScoringConfig | None = None
    """The ESI it estimates: L, k, distance, intervention... (a guard must match it)."""
    features: tuple[str, ...] = PROBE_SIGNALS
    """The free signals it reads."""
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    intercept: float
    strength: float
    """The L2 strength cross-validation chose."""
    hidden: HiddenProbe | None = None
    """The states' term (its ``selection``: held-out mean squared error per candidate)."""
    band: float = Field(ge=0)
    """Held-out quantile of ``|ESI - estimate|`` at ``coverage``: a label-free band's half-width."""
    coverage: float = Field(gt=0, lt=1)
    n_fit: int
    """Answers it was fitted on."""
    quality: dict[str, Any] = {}
    """Held out (nested cross-validation): ``spearman`` and ``r2`` with 95% intervals, ``n``;
    ``signals_only``: the same for a probe on the free signals alone."""
    held_out_estimates: tuple[float, ...] = ()
    """Distillation answers' estimates by probes fitted without them (nested cross-validation),
    beside :attr:`held_out_esi`: what a label-free cascade certifies its band on."""
    held_out_esi: tuple[float, ...] = ()
    """Those answers' full-L ESI scores."""
    created: str | None = None
    esi_guard_version: str | None = None

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The states a backend must read for it; None: none."""
        return None if self.hidden is None else self.hidden.spec

    def estimate(self, signals: Mapping[str, float], hidden: HiddenStates | None = None) -> float:
        """The answer's estimated ESI score."""
        missing = [name for name in self.features if name not in signals]
        if missing:
            msg = f"the ESI probe needs the signals {missing} (got {sorted(signals)})"
            raise ConfigurationError(msg)
        x = (np.array([signals[n] for n in self.features]) - self.mean) / np.array(self.scale)
        value = self.intercept + float(np.dot(self.weights, x))
        if self.hidden is not None:
            if hidden is None:
                msg = "the ESI probe reads hidden states and got none"
                raise ConfigurationError(msg)
            value += self.hidden.term(hidden)
        return value

    def write(self, path: str | Path) -> None:
        """Write as indented JSON."""
        Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> ESIProbe:
        """Read and validate; every problem is a :class:`ConfigurationError` naming the file."""
        return read_model(cls, path, name="ESI probe file", kind="an esi-guard ESI probe",
                          file_format=ESI_PROBE_FORMAT,
                          hint="; `esi-guard distill` writes one")  # fmt: skip


class Band(BaseModel):
    """Where the cheap score is too close to the threshold to decide on: ESI runs there."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float
    high: float
    fitted: dict[str, Any] | None = None
    """From :func:`~esi_guard.calibration.cascade_fit.fit_band`: ``disagreement``, its ``bound`` at
    ``1 - delta``, ``max_disagreement``, ``delta``, ``esi_share``, ``n``; None: the probe's band."""


class Cascade(BaseModel):
    """The cheap score (a probe, or a no-ESI combined score) and its band, as files hold them.

    A stage before ESI (:meth:`esi_guard.policy.Policy.of`, :class:`~esi_guard.policy.Stage`).
    With ``probe`` the cheap score estimates ESI; with ``free`` (``esi-guard calibrate
    --cascade``) it is a no-ESI ``p_wrong``, and inside the band ESI runs and ``combined`` decides.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    probe: ESIProbe | None = None
    band: Band
    combined: CombinedScore | None = None
    """With ``free``: what decides inside the band (a combined score with ESI)."""
    free: CombinedScore | None = None
    """A value-of-information cascade's cheap score: a combined score without ESI."""

    @model_validator(mode="after")
    def _one_cheap_score(self) -> Cascade:
        if (self.probe is None) == (self.free is None):
            msg = "a cascade has either an ESI probe or a no-ESI combined score (free)"
            raise ValueError(msg)
        if self.free is not None and ("esi" in self.free.features or self.combined is None):
            msg = "a value-of-information cascade needs free without esi, and combined with it"
            raise ValueError(msg)
        if self.probe is not None and self.combined is not None:
            error = retired("esi_probe_on_combined")
            raise error
        return self

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The states the cheap score reads (the probe's, and the combined scores')."""
        scores = (self.probe, self.combined, self.free)
        return merged(*(score.needs_hidden for score in scores if score is not None))
