"""An answer's decision as an ordered list of stages: the guard's one decision policy.

Each :class:`Stage` has a score, what it needs (the answer's own pass, or ESI's L forced variants),
hence its cost, and a stop band: below it the answer is accepted, above it the action is taken,
inside it the next stage decides; the last stage decides at the threshold. Every guard mode is such
a list (:meth:`Policy.of`):

==========================  ===========================================  =================
guard                       stages                                       ``decided_by``
==========================  ===========================================  =================
plain ESI (the default)     ``[esi]``                                    None
combined score with ESI     ``[esi (p_wrong)]``                          None
combined score without ESI  ``[free (p_wrong)]``                         ``free``
value cascade               ``[free (band), esi (p_wrong)]``             ``free``/``esi``
label-free ESI-probe        ``[probe (band), esi]``                      ``probe``/``esi``
==========================  ===========================================  =================

Deciding per sentence (``decide_on="sentences"``, ``redact``) needs a policy of ESI alone. Pure
(no model, no LangChain): the pipeline asks a policy what to read (:attr:`Policy.needs_hidden`,
:attr:`Policy.uses_esi`) and which stage decides (:meth:`Policy.early`);
:class:`~esi_guard._pipeline.decide.Rule` makes the result.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from esi_guard.backends.hidden import HiddenSpec, HiddenStates, merged
from esi_guard.cascade import Band, Cascade, ESIProbe
from esi_guard.combined import CombinedScore
from esi_guard.exceptions import ConfigurationError

__all__ = ["Early", "Granularity", "Policy", "Stage", "StageName", "granularity"]

StageName = Literal["free", "probe", "esi"]
"""What a stage decides on: a combined score without ESI, the ESI probe's estimate, or ESI."""

Granularity = Literal["answer", "sentence"]

Route = Literal["accept", "untrusted"]


def granularity(action: str, decide_on: str, stream_mode: str = "hold") -> Granularity:
    """``sentence`` for a guard that redacts, decides on or streams sentences, else ``answer``."""
    sentences = action == "redact" or "sentences" in (decide_on, stream_mode)
    return "sentence" if sentences else "answer"


@dataclass(frozen=True)
class Stage:
    """One stage: its name, its score (None: ESI itself) and its stop band (None: last)."""

    name: StageName
    score: CombinedScore | ESIProbe | None = None
    """``free``: a no-ESI combined score; ``probe``: an ESI probe; ``esi``: one with ESI or None."""
    band: Band | None = None
    """Accept below ``low``, act above ``high``, else the next stage; None on the last."""

    def __post_init__(self) -> None:
        reads_esi = isinstance(self.score, CombinedScore) and self.score.uses_esi
        if self.name == "free" and (not isinstance(self.score, CombinedScore) or reads_esi):
            msg = "a free stage decides on a combined score without ESI"
            raise ConfigurationError(msg)
        if self.name == "probe" and not isinstance(self.score, ESIProbe):
            msg = "a probe stage decides on an ESI probe"
            raise ConfigurationError(msg)
        if self.name == "esi" and self.score is not None and not reads_esi:
            msg = "an esi stage decides on ESI or on a combined score that reads it"
            raise ConfigurationError(msg)

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """The hidden states its score reads (None: none)."""
        return None if self.score is None else self.score.needs_hidden

    def value(
        self, signals: Mapping[str, float], hidden: HiddenStates | None
    ) -> tuple[float, float | None]:
        """An early stage's score of the answer and its hidden-state term (None: none)."""
        if isinstance(self.score, ESIProbe):
            return self.score.estimate(signals, hidden), None
        assert isinstance(self.score, CombinedScore)  # a free stage
        return self.score.scored(signals, hidden)

    def route(self, value: float, threshold: float) -> Route | None:
        """The stage's decision on ``value``, or None: the next stage decides."""
        if self.band is None:
            return "accept" if value <= threshold else "untrusted"
        if value < self.band.low:
            return "accept"
        if value > self.band.high:
            return "untrusted"
        return None

    def describe(self, threshold: float) -> str:
        """``free (band [0.1, 0.3])``, ``esi + p_wrong (threshold 0.2)``..."""
        what = self.name + (" + p_wrong" if self.name == "esi" and self.score else "")
        if self.band is None:
            return f"{what} (threshold {threshold:g})"
        return f"{what} (band [{self.band.low:g}, {self.band.high:g}])"


@dataclass(frozen=True)
class Early:
    """An early stage's reading of an answer (no variant forced)."""

    stage: Stage
    value: float
    """The stage's score: a ``free`` stage's ``p_wrong``, a ``probe`` stage's estimate."""
    term: float | None
    """The score's hidden-state term, when it reads states."""
    route: Route | None
    """Its decision; None: inside its band, the next stage decides."""


@dataclass(frozen=True)
class Policy:
    """The stages an answer goes through, in order, and the threshold of the last."""

    stages: tuple[Stage, ...]
    threshold: float
    granularity: Granularity = "answer"

    def __post_init__(self) -> None:
        if not self.stages:
            msg = "a decision policy needs at least one stage"
            raise ConfigurationError(msg)
        *early, last = self.stages
        if last.band is not None or any(stage.band is None for stage in early):
            msg = "every stage but the last has a band; the last decides at the threshold"
            raise ConfigurationError(msg)
        if any(stage.name == "esi" for stage in early):
            msg = "ESI is the last stage: no stage after it is cheaper"
            raise ConfigurationError(msg)
        for stage in early:
            band = stage.band
            assert band is not None  # checked above
            if not band.low <= self.threshold <= band.high:
                msg = (
                    f"the {stage.name} stage's band [{band.low:g}, {band.high:g}] must hold "
                    f"the threshold {self.threshold:g}"
                )
                raise ConfigurationError(msg)
        if self.granularity == "sentence" and (
            len(self.stages) > 1 or last.name != "esi" or last.needs_hidden is not None
        ):
            msg = (
                "a guard deciding on sentences (action='redact', decide_on='sentences', "
                "stream_mode='sentences') decides on each sentence's own ESI, so its policy is "
                f"ESI alone (no cascade, no combined score without ESI or with a hidden-state "
                f"probe); this one is {self.describe()}"
            )
            raise ConfigurationError(msg)

    @classmethod
    def of(
        cls,
        threshold: float,
        *,
        combined: CombinedScore | None = None,
        cascade: Cascade | None = None,
        granularity: Granularity = "answer",
    ) -> Policy:
        """The policy of a guard's settings: its combined score and its cascade."""
        if cascade is not None:
            cheap = (
                Stage("probe", cascade.probe, cascade.band)
                if cascade.probe is not None
                else Stage("free", cascade.free, cascade.band)
            )
            return cls((cheap, Stage("esi", cascade.combined)), threshold, granularity)
        if combined is not None and not combined.uses_esi:
            return cls((Stage("free", combined),), threshold, granularity)
        return cls((Stage("esi", combined),), threshold, granularity)

    @property
    def last(self) -> Stage:
        """The stage that decides what no earlier one did."""
        return self.stages[-1]

    @property
    def uses_esi(self) -> bool:
        """Whether any answer may need its variants forced."""
        return self.last.name == "esi"

    @property
    def decides_early(self) -> bool:
        """Whether an answer may be decided right after generation (no variant forced)."""
        return self.stages[0].name != "esi"

    @property
    def combined(self) -> CombinedScore | None:
        """The combined score ESI's stage decides on (None: on ESI, or no ESI stage)."""
        score = self.last.score
        return score if self.uses_esi and isinstance(score, CombinedScore) else None

    @property
    def decided_by_esi(self) -> StageName | None:
        """``decided_by`` of an answer ESI decided: ``esi`` after an earlier stage, else None."""
        return "esi" if self.uses_esi and len(self.stages) > 1 else None

    @property
    def needs_hidden(self) -> HiddenSpec | None:
        """Every hidden state a stage reads, merged (None: none)."""
        return merged(*(stage.needs_hidden for stage in self.stages))

    def early(self, signals: Mapping[str, float], hidden: HiddenStates | None) -> list[Early]:
        """The stages before ESI that read the answer, in order, up to the one that decides.

        The last one's ``route`` decides (if None, or none read it, ESI does); a stage lacking its
        states passes the answer on. The caller makes an unscorable last stage unscored.
        """
        read: list[Early] = []
        for stage in self.stages:
            if stage.name == "esi":
                break
            needs = stage.needs_hidden
            if needs is not None and (
                hidden is None or not set(needs.layers) <= set(hidden.layers)
            ):
                continue
            value, term = stage.value(signals, hidden)
            read.append(Early(stage, value, term, stage.route(value, self.threshold)))
            if read[-1].route is not None:
                break
        return read

    def describe(self) -> str:
        """The stages in order: ``probe (band [0.2, 0.4]) -> esi (threshold 0.3)``."""
        return " -> ".join(stage.describe(self.threshold) for stage in self.stages)
