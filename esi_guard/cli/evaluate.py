"""``esi-guard evaluate``: a threshold file's metrics, coverage and selective risk on other data."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from esi_guard.calibration.calibrate_combined import decode_states
from esi_guard.calibration.file import ThresholdFile
from esi_guard.calibration.metrics import (
    auroc,
    bootstrap,
    expected_calibration_error,
    undefined_because,
)
from esi_guard.cli import build
from esi_guard.cli._options import (
    AnswersField,
    AnswersSep,
    ApiBase,
    ApiMode,
    BatchSize,
    Cache,
    ChatTemplateOption,
    Data,
    Device,
    DType,
    IncorrectField,
    Judge,
    LabelMethod,
    Labels,
    LabelThreshold,
    Limit,
    LocalBackend,
    Model,
    QuestionField,
    RayAddress,
    Resamples,
    Runner,
    Seed,
    Threads,
    Workers,
)
from esi_guard.cli.output import console, data_name, fail, needs_extra, shown, used_modules
from esi_guard.cli.run import Source, report, score_run
from esi_guard.combined import CombinedScore, repetition
from esi_guard.exceptions import ConfigurationError, ESIGuardError
from esi_guard.guard import ESIGuard

__all__ = ["cached_p_wrong", "evaluate"]


def evaluate(
    threshold: Annotated[Path, typer.Option("--threshold", help="A threshold file.")],
    data: Data,
    question_field: QuestionField = None,
    answers_field: AnswersField = None,
    incorrect_field: IncorrectField = None,
    answers_sep: AnswersSep = "; ",
    limit: Limit = None,
    seed: Seed = None,
    model: Model = "default",
    api_base: ApiBase = None,
    api_mode: ApiMode = "auto",
    device: Device = None,
    dtype: DType = None,
    runner: Runner = LocalBackend.auto,
    chat_template: ChatTemplateOption = None,
    threads: Threads = None,
    labels: Labels = LabelMethod.containment,
    label_threshold: LabelThreshold = None,
    judge: Judge = None,
    cache: Cache = None,
    batch_size: BatchSize = 8,
    resamples: Resamples = 1000,
    workers: Workers = None,
    ray_address: RayAddress = None,
) -> None:
    """Metrics, realised coverage and selective risk of a threshold file on another set."""
    build.local_threads(threads, api_base, dtype=dtype, device=device, runner=runner)
    needs_extra("evaluate", used_modules(labels=labels.value))
    try:
        calibrated = ThresholdFile.read(threshold)
    except ESIGuardError as exc:
        fail(str(exc))
    if calibrated.granularity == "sentence":
        fail(
            f"{threshold} holds a threshold on each sentence (calibrate --granularity "
            "sentence): evaluate scores one question's whole answer at a time, on which "
            "it does not apply; its calibration report is in the file (sentence_report)"
        )
    chosen = build.ModelOptions(model, api_base, api_mode, device, runner, chat_template, dtype,
                                build.worker_threads(threads, workers, api_base))  # fmt: skip
    request = {
        **chosen.request(),
        "threshold": calibrated.model_dump(mode="json",
                                           include={"scoring", "combined",
                                                    "esi_probe", "probe_band", "free_score"}),
    }  # fmt: skip
    run = score_run(
        partial(_guard, threshold.resolve(), chosen),
        Source(data, (question_field, answers_field, incorrect_field), limit, seed, answers_sep),
        request=request, labeller=lambda: build.labeller(labels, label_threshold, judge),
        cache=cache, system=calibrated.scoring.system_prompt or "", prompt_file=None,
        batch_size=batch_size, template=calibrated.scoring.prompt_template,
        workers=workers, ray_address=ray_address, worker_cpus=build.worker_cpus(chosen),
    )  # fmt: skip
    scores, wrong = run.scores, run.wrong
    if all(r["score"] is not None for r in run.records if r["scored"]):
        report(run, data, resamples)
    else:  # some decided without ESI: there is no ESI score to report on
        console.print(f"{data_name(data)}: n={len(wrong)}, accuracy "
                      f"{1 - sum(wrong) / len(wrong):.3f}, labels {run.labeller.name}")  # fmt: skip
    if calibrated.combined is not None:  # the threshold is on P(wrong)
        scores = [cached_p_wrong(r, calibrated.combined) for r in run.records if r["scored"]]
        ece = expected_calibration_error(scores, wrong)
        estimate = bootstrap(auroc, scores, wrong, n_resamples=resamples)
        console.print(f"P(wrong): AUROC [95% CI] {shown(estimate, undefined_because(wrong))}, "
                      f"ECE {ece:.3f}")  # fmt: skip
    accepted = [w for s, w in zip(scores, wrong, strict=True) if s <= calibrated.threshold]
    risk = f"{sum(accepted) / len(accepted):.3f}" if accepted else "n/a (no answer accepted)"
    console.print(
        f"threshold {calibrated.threshold:.4f} ({calibrated.method}): coverage "
        f"{len(accepted) / len(scores):.3f}, selective risk {risk}"
        + (f" (unscored, withheld: {run.unscored})" if run.unscored else "")
    )
    if calibrated.guarantee:
        console.print(f"calibrated guarantee: {calibrated.guarantee['statement']}")
    paths = [r["decided_by"] for r in run.records if r.get("decided_by")]
    if paths and calibrated.combined is not None and not calibrated.combined.uses_esi:
        console.print(f"no ESI: {len(paths)} answers decided on P(wrong), no variant forced")
    elif paths:
        console.print(
            f"cascade: full ESI ran on {paths.count('esi')} of {len(paths)} answers "
            f"({paths.count('esi') / len(paths):.1%}); the cheap score decided the others"
        )


def _guard(threshold: Path, chosen: build.ModelOptions) -> ESIGuard:
    """The guard the file describes, on the chosen model (built here or in a Ray worker)."""
    return ESIGuard.from_calibration(threshold, backend=build.backend(chosen))


def cached_p_wrong(record: dict[str, Any], combined: CombinedScore) -> float:
    """A cached record's ``P(wrong)`` under ``combined``, as scored or from signals and states."""
    if record.get("p_wrong") is not None:
        return float(record["p_wrong"])
    signals = {"esi": record["score"], "repetition": repetition(record.get("prediction") or ""),
               **(record.get("signals") or {})}  # fmt: skip
    hidden = record.get("hidden")
    try:
        if combined.hidden is None:
            return combined.p_wrong(signals)
        if not hidden:
            msg = "the file's score reads hidden states and this cache holds none"
            raise ConfigurationError(msg)
        return combined.p_wrong(signals, decode_states(hidden))
    except (ConfigurationError, TypeError) as exc:
        fail(
            f"a cached answer has no P(wrong) and it cannot be computed ({exc}): evaluate "
            "with a new --cache"
        )
