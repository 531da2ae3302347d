"""``esi-guard calibrate --granularity sentence``: a threshold on each sentence's score.

Questions are asked ``--questions-per-prompt`` at a time; every sentence is scored and labelled
(:mod:`esi_guard.cli.run.sentences`). ``--select risk`` backs off conformally
(:mod:`esi_guard.calibration.backoff`): with probability ``1 - delta``, at most ``alpha`` of the
answers keep a wrong sentence; other rules choose on the sentences as for answers. The file records
``granularity="sentence"``: its guard (``decide_on="sentences"``) acts on an answer with a sentence
past the threshold, or with ``action="redact"`` removes those sentences.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from esi_guard import __version__
from esi_guard.calibration.backoff import by_backoff
from esi_guard.calibration.data import load_files
from esi_guard.calibration.file import DatasetInfo, ThresholdFile
from esi_guard.calibration.thresholds import Choice
from esi_guard.cli._options import Selection
from esi_guard.cli.output import check_classes, console, data_name, fail, shown, warn
from esi_guard.cli.run import summary
from esi_guard.cli.run.sentences import score_sentence_run
from esi_guard.exceptions import ESIGuardError
from esi_guard.guard import ESIGuard

__all__ = ["calibrate_sentences"]


def calibrate_sentences(
    guard: Callable[[], ESIGuard],
    data: list[Path],
    out: Path,
    *,
    k: int,
    request: dict[str, Any],
    load: dict[str, Any],
    limit: int | None,
    seed: int | None,
    system: str | None,
    cache: Path | None,
    batch_size: int,
    select: Selection,
    targets: dict[str, float],
    rule: Callable[[list[float], list[int]], Choice | None],
    resamples: int,
) -> None:
    """Score the grouped prompts, report per sentence, choose and write the threshold."""
    try:
        examples = load_files(data, limit=limit, seed=seed, **load)
        run = score_sentence_run(guard, examples, k, request=request, data=data, cache=cache,
                                 system=system, batch_size=batch_size)  # fmt: skip
    except (ESIGuardError, ImportError) as exc:
        fail(str(exc))
    scores, wrong, prompts = run.flat
    if not scores:
        fail("no sentence could be scored and labelled")
    report = run.report()
    console.print(
        f"{report['prompts']} prompts of {k} questions ({report['scored_prompts']} scored): "
        f"{report['sentences']} sentences, {report['labelled']} aligned to a question and "
        f"labelled ({report['right']} right), {report['unaligned']} unaligned and left out"
    )
    check_classes(wrong, "sentences")
    # A prompt's sentences share one answer: the intervals resample whole prompts.
    metrics = summary(scores, wrong, resamples, "sentences", clusters=prompts)
    console.print(f"sentence AUROC {shown(metrics['auroc'])} on {len(scores)} sentences of "
                  f"{data_name(data)}")  # fmt: skip
    if select is Selection.risk:
        if len(run.answers) < 100:
            warn(f"only {len(run.answers)} answers: a guarantee over answers from so few "
                 "is weak; calibrate on a few hundred prompts")  # fmt: skip
        choice = by_backoff(run.answers, targets["alpha"], targets["delta"])
    else:
        choice = rule(scores, wrong)
    if choice is None:
        fail(
            f"no sentence threshold keeps the share of answers with a wrong kept sentence "
            f"at or below alpha={targets['alpha']:g} with delta={targets['delta']:g} on these "
            f"{len(run.answers)} answers; no threshold file written. Calibrate on more "
            "examples, or raise --alpha or --delta.",
            code=1,
        )
    dataset = DatasetInfo(path=", ".join(map(str, data)), sha256=run.digest,
                          n=len(examples), limit=limit, seed=seed)  # fmt: skip
    written = ThresholdFile.from_run(
        run.header, choice, label_method="containment", dataset=dataset, metrics=metrics,
        version=__version__, granularity="sentence", sentence_report=report,
    )  # fmt: skip
    written.write(out)
    wrong_kept = (
        "" if math.isnan(choice.selective_risk) else f", {choice.selective_risk:.3f} of them wrong"
    )
    console.print(
        f"sentence threshold {choice.threshold:.4f} ({choice.method}): keeps "
        f"{choice.coverage:.3f} of the calibration sentences{wrong_kept}"
    )
    if choice.guarantee:
        console.print(f"guarantee: {choice.guarantee['statement']}")
    console.print(f"wrote {out}")
