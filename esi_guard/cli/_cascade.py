"""``calibrate --esi-probe FILE``: the cascade's band, fitted on the calibration answers.

:func:`~esi_guard.calibration.cascade_fit.fit_band` finds the narrowest band of the probe's cheap
score whose decisions differ from full ESI's on at most ``--max-disagreement`` of the answers, with
probability ``1 - --stop-delta``. Refused with ``--score combined``: ``--cascade`` fits its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esi_guard.calibration.calibrate_combined import decode_states
from esi_guard.calibration.cascade_fit import fit_band
from esi_guard.cascade import ESIProbe
from esi_guard.cli.output import console, fail
from esi_guard.cli.run import Run
from esi_guard.exceptions import ESIGuardError

__all__ = ["fit_cascade", "read_probe"]


def read_probe(path: Path) -> ESIProbe:
    """The probe file, or the command ends naming the problem."""
    try:
        return ESIProbe.read(path)
    except ESIGuardError as exc:
        fail(str(exc))


def fit_cascade(
    run: Run, probe: ESIProbe, threshold: float, most: float, delta: float
) -> dict[str, Any]:
    """The threshold file's ``esi_probe`` and ``probe_band``; the command ends if none fits."""
    scoring = run.scoring
    problems = [] if probe.scoring is None else probe.scoring.score_differences(scoring)
    if probe.model != run.header.model and probe.model_sha256 != run.header.model_sha256:
        problems.insert(0, f"model: {probe.model!r} vs {run.header.model!r}")
    if problems:
        fail("the ESI probe does not match this run (distilled vs calibrated): "
             + "; ".join(problems))  # fmt: skip
    scored = [r for r in run.records if r["scored"]]
    picks, full = list(range(len(scored))), [float(r["score"]) for r in scored]
    try:
        cheap = []
        for i in picks:
            record = scored[i]
            states = decode_states(record["hidden"]) if record.get("hidden") else None
            cheap.append(probe.estimate(record["signals"], states))
    except ESIGuardError as exc:
        fail(f"the ESI probe cannot read these results: {exc}")
    fitted = fit_band(cheap, full, threshold, max_disagreement=most, delta=delta)
    if fitted is None:
        fail(
            f"cascade: no band keeps its decisions within {most:g} of full-ESI ones with "
            f"probability >= {1 - delta:g} on these {len(picks)} answers; raise "
            "--max-disagreement or calibrate on more examples"
        )
    info = fitted.fitted or {}
    console.print(
        f"cascade: ESI runs where the cheap score is in [{fitted.low:.4f}, {fitted.high:.4f}] "
        f"({info['esi_share']:.1%} of {len(picks)} answers); its decisions differ from full "
        f"ESI on {info['disagreement']:.3f} (<= {info['bound']:.3f} with probability "
        f"{1 - delta:g})"
    )
    return {"esi_probe": probe, "probe_band": fitted}
