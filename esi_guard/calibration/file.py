"""The threshold file ``calibrate`` writes and ``from_calibration`` loads: JSON, no pickle."""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from esi_guard import _retired
from esi_guard._files import read_model
from esi_guard.calibration.metrics import Estimate
from esi_guard.calibration.thresholds import Choice
from esi_guard.cascade import Band, Cascade, ESIProbe
from esi_guard.combined import CombinedScore
from esi_guard.policy import Policy
from esi_guard.result import ScoringConfig

__all__ = ["FORMAT", "DatasetInfo", "ScoredRun", "ThresholdFile"]

FORMAT = "esi-guard/threshold"


class ScoredRun(Protocol):
    """What a scored run says of its model and scoring (``esi-guard calibrate``'s header)."""

    @property
    def model(self) -> str: ...  # noqa: D102
    @property
    def engine(self) -> str | None: ...  # noqa: D102
    @property
    def model_sha256(self) -> str | None: ...  # noqa: D102
    @property
    def scoring(self) -> ScoringConfig: ...  # noqa: D102


class DatasetInfo(BaseModel):
    """Which labelled examples the threshold was calibrated on."""

    model_config = ConfigDict(extra="forbid")

    path: str
    sha256: str
    """Hash of the examples used (questions and gold answers, in order)."""
    n: int = Field(ge=1)
    limit: int | None = None
    seed: int | None = None
    """The ``--seed`` the examples were shuffled with; None: not shuffled (file order)."""


class ThresholdFile(BaseModel):
    """A calibrated threshold and everything needed to trust or refuse it."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["esi-guard/threshold"] = "esi-guard/threshold"
    version: Literal[1] = 1
    threshold: float
    method: str
    """How it was chosen: ``coverage=0.8``, ``f1``, ``youden``, ``risk<=0.3@delta=0.1``."""
    guarantee: dict[str, Any] | None = None
    """For the risk rule: alpha, delta, bound and the statement of the guarantee."""
    calibration_coverage: float
    calibration_selective_risk: float | None
    model: str
    """The backend's ``model_id``."""
    model_sha256: str | None = None
    """The backend's ``model_sha256`` (GGUF digest), if any: same weights match however loaded."""
    engine: str | None = None
    """The backend's ``engine`` (``transformers``, ``llamacpp``...); None: not recorded."""
    scoring: ScoringConfig
    label_method: str
    dataset: DatasetInfo
    metrics: dict[str, dict[str, float | None]]
    """Each metric's value and 95% bootstrap interval (``value``, ``low``, ``high``)."""
    created: str
    esi_guard_version: str
    combined: CombinedScore | None = None
    """``calibrate --score combined``: the score (``p_wrong``) the threshold is on; None: ESI."""
    combined_report: dict[str, Any] | None = None
    """How the combined score was fitted and checked (``n_fit``, ``n_select``, ``ece``, AUROC)."""

    esi_probe: ESIProbe | None = None
    """``calibrate --esi-probe FILE``: the ESI probe of the guard's cascade."""
    probe_band: Band | None = None
    """Its band (``fitted``: the certificate); with ``free_score``, on that score's ``p_wrong``."""
    granularity: Literal["answer", "sentence"] = "answer"
    """Whole answers, or each sentence (``--granularity sentence``: ``decide_on="sentences"``)."""
    sentence_report: dict[str, Any] | None = None
    """``--granularity sentence``: prompts, sentences, how many aligned and labelled or left out."""
    free_score: CombinedScore | None = None
    """``--cascade``: the cheap score (no ESI); in ``probe_band``, ESI and ``combined`` decide."""

    @model_validator(mode="before")
    @classmethod
    def _not_retired(cls, data: Any) -> Any:
        """A file of a retired mode is refused in one line (:mod:`esi_guard._retired`)."""
        if not isinstance(data, dict):
            return data
        probe_on_combined = data.get("esi_probe") is not None and data.get("combined") is not None
        if probe_on_combined and data.get("free_score") is None:
            error = _retired.retired("esi_probe_on_combined")
            raise error
        return _retired.check(data, ("sequential",))

    @property
    def policy(self) -> Policy:
        """The stages a guard made from this file decides with (``from_calibration``).

        A file with an ESI probe and no band shows ESI alone: the guard fits the band when built.
        """
        cascade = None
        if self.probe_band is not None and self.free_score is not None:
            cascade = Cascade(free=self.free_score, band=self.probe_band, combined=self.combined)
        elif self.probe_band is not None and self.esi_probe is not None:
            cascade = Cascade(probe=self.esi_probe, band=self.probe_band)
        return Policy.of(self.threshold, combined=self.combined, cascade=cascade,
                         granularity=self.granularity)  # fmt: skip

    @classmethod
    def from_run(
        cls, run: ScoredRun, choice: Choice, *, label_method: str, dataset: DatasetInfo,
        metrics: Mapping[str, Estimate], version: str, **fitted: Any,
    ) -> ThresholdFile:  # fmt: skip
        """The file of ``choice`` made on ``run``; ``fitted``: ``combined`` and the like."""
        risk = choice.selective_risk
        return cls(
            threshold=choice.threshold, method=choice.method, guarantee=choice.guarantee,
            calibration_coverage=choice.coverage,
            calibration_selective_risk=None if math.isnan(risk) else risk,
            model=run.model, engine=run.engine, model_sha256=run.model_sha256,
            scoring=run.scoring, label_method=label_method, dataset=dataset,
            metrics={name: _no_nan(e) for name, e in metrics.items()},
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            esi_guard_version=version, **fitted,
        )  # fmt: skip

    def write(self, path: str | Path) -> None:
        """Write as indented JSON."""
        Path(path).write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: str | Path) -> ThresholdFile:
        """Read and validate; every problem is a ConfigurationError naming the file."""
        return read_model(cls, path, name="threshold file",
                          kind="an esi-guard threshold file", file_format=FORMAT)  # fmt: skip


def _no_nan(estimate: Estimate) -> dict[str, float | None]:
    """An estimate as the file stores it (NaN as None)."""
    values = {"value": estimate.value, "low": estimate.low, "high": estimate.high}
    return {key: None if math.isnan(value) else value for key, value in values.items()}
