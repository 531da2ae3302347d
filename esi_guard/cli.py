r"""``esi-guard``: calibrate a threshold on labelled QA data, and evaluate one on another set.

    esi-guard calibrate --data ../shared/data/triviaqa/subset.jsonl --limit 300 \\
        --out threshold.json --plot calibration.png --cache triviaqa.jsonl
    esi-guard evaluate --threshold threshold.json --data ../shared/data/sciq/test.jsonl

Needs the ``cli`` extra (typer, rich, scikit-learn, scipy, matplotlib, the packaged
all-MiniLM-L6-v2) and a backend's extra (``hf`` for local models, ``api`` for servers).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from esi_guard import __version__
from esi_guard._cli_options import (
    AnswersField,
    ApiBase,
    ApiMode,
    BatchSize,
    Cache,
    ChatTemplateOption,
    Data,
    Device,
    DType,
    IncorrectField,
    InterventionName,
    Judge,
    LabelMethod,
    Labels,
    LabelThreshold,
    Limit,
    LocalBackend,
    Model,
    PromptFile,
    QuestionField,
    Resamples,
    Runner,
    ScoreName,
    Seed,
    Selection,
    System,
)
from esi_guard._cli_run import Run, as_dict, console, report, score_run
from esi_guard.backends.adapters import local_backend
from esi_guard.backends.base import Backend
from esi_guard.calibration import labels as label_methods
from esi_guard.calibration.combining import Combined, fit_on_part
from esi_guard.calibration.file import DatasetInfo, ThresholdFile
from esi_guard.calibration.metrics import Estimate, auroc, bootstrap, expected_calibration_error
from esi_guard.calibration.runner import scoring_config
from esi_guard.calibration.thresholds import (
    Choice,
    by_coverage,
    by_f1,
    by_risk,
    by_youden,
    fit_stop_constant,
)
from esi_guard.exceptions import ESIGuardError
from esi_guard.guard import ESIGuard
from esi_guard.interventions import SkipOneChar, Typo

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__.split("\n")[0])


def _backend(
    model: str, api_base: str | None, api_mode: str, device: str | None,
    runner: LocalBackend = LocalBackend.transformers, chat_template: str | None = None,
    dtype: str | None = None,
) -> Backend:  # fmt: skip
    if api_base:
        from esi_guard.backends.openai import OpenAIBackend

        return OpenAIBackend(model, base_url=api_base, mode=api_mode)  # type: ignore[arg-type]
    template = chat_template
    if template is not None and template != "completion":
        template = Path(template).read_text(encoding="utf-8")
    return local_backend(model, engine=runner.value, device=device, chat_template=template,
                         dtype=dtype)  # fmt: skip


def _labeller(method: LabelMethod, threshold: float | None, judge: str | None) -> Any:
    if method is LabelMethod.containment:
        return label_methods.Containment()
    if method is LabelMethod.exact:
        return label_methods.ExactMatch()
    if method is LabelMethod.f1:
        return label_methods.TokenF1(threshold or 0.5)
    if method is LabelMethod.semantic:
        return label_methods.Semantic(threshold or 0.7)
    if not judge or ":" not in judge:
        msg = "--labels judge needs --judge module:attribute"
        raise typer.BadParameter(msg, param_hint="judge")
    module, _, attribute = judge.partition(":")
    return label_methods.LLMJudge(getattr(importlib.import_module(module), attribute))


def _guard(
    model: str, api_base: str | None, api_mode: str, device: str | None, runner: LocalBackend,
    chat_template: str | None, intervention: str, n_variants: int, top_k: int, distance: str,
    max_new_tokens: int, seed: int, dtype: str | None = None,
) -> ESIGuard:  # fmt: skip
    backend = _backend(model, api_base, api_mode, device, runner, chat_template, dtype)
    kind = SkipOneChar if intervention == "soc" else Typo
    return ESIGuard(
        backend=backend, threshold=0.0, intervention=kind(),  # decisions unused here
        n_variants=n_variants, top_k=top_k, distance=distance,
        max_new_tokens=max_new_tokens, seed=seed,
    )  # fmt: skip


def _stop_rule(
    records: list[dict[str, Any]], threshold: float, min_variants: int, most: float, delta: float
) -> dict[str, Any] | None:
    """Fit sequential ESI's stopping constant on the run's variant scores, and say so."""
    rows = [r["variant_scores"] for r in records if r["scored"] and r.get("variant_scores")]
    rule = fit_stop_constant(
        rows, threshold, min_variants=min_variants, max_disagreement=most, delta=delta
    )
    if rule is None:
        console.print(
            f"[yellow]sequential ESI: no stopping constant keeps early decisions within "
            f"{most:g} of the full-L ones with probability >= {1 - delta:g} on these "
            f"{len(rows)} answers; the file holds no stopping rule.[/yellow] Raise "
            "--max-disagreement or calibrate on more examples (a cache written before "
            "variant scores were recorded holds none: rerun without it)."
        )
        return None
    console.print(
        f"sequential ESI: stop constant {rule.constant:g} from {rule.min_variants} variants: "
        f"{rule.variants_used_mean:.2f} variants per answer, early decision differs from the "
        f"full-L one on {rule.disagreement:.3f} of {len(rows)} answers (<= {rule.bound:.3f} "
        f"with probability {1 - delta:g})"
    )
    return asdict(rule)


@app.command()
def calibrate(
    data: Data,
    out: Annotated[Path, typer.Option(help="Where to write the threshold file (JSON).")],
    question_field: QuestionField = None,
    answers_field: AnswersField = None,
    incorrect_field: IncorrectField = None,
    limit: Limit = None,
    seed: Seed = None,
    model: Model = "default",
    api_base: ApiBase = None,
    api_mode: ApiMode = "auto",
    device: Device = None,
    dtype: DType = None,
    runner: Runner = LocalBackend.transformers,
    chat_template: ChatTemplateOption = None,
    intervention: Annotated[InterventionName, typer.Option()] = InterventionName.soc,
    n_variants: Annotated[int, typer.Option(help="L, variants per question.")] = 10,
    top_k: Annotated[int, typer.Option(help="k, tokens kept per distribution.")] = 100,
    distance: Annotated[
        str, typer.Option(help="hellinger, squared_hellinger, kl...")
    ] = "hellinger",
    max_new_tokens: Annotated[int, typer.Option()] = 24,
    system: System = None,
    prompt: PromptFile = None,
    labels: Labels = LabelMethod.containment,
    label_threshold: LabelThreshold = None,
    judge: Judge = None,
    select: Annotated[
        Selection, typer.Option(help="How to choose the threshold.")
    ] = Selection.risk,
    alpha: Annotated[float, typer.Option(help="Target selective risk (--select risk).")] = 0.3,
    delta: Annotated[float, typer.Option(help="Allowed failure probability (risk).")] = 0.1,
    coverage: Annotated[float, typer.Option(help="Target coverage (--select coverage).")] = 0.8,
    plot: Annotated[Path | None, typer.Option(help="PNG with ROC and risk-coverage.")] = None,
    cache: Cache = None,
    batch_size: BatchSize = 8,
    resamples: Resamples = 1000,
    min_variants: Annotated[
        int | None,
        typer.Option(help="Also fit sequential ESI's stopping rule, first round of N variants."),
    ] = None,
    max_disagreement: Annotated[
        float,
        typer.Option(help="Sequential: most early decisions differing from full-L ones."),
    ] = 0.05,
    stop_delta: Annotated[
        float, typer.Option(help="Sequential: allowed failure probability of that bound.")
    ] = 0.1,
    score: Annotated[
        ScoreName,
        typer.Option(help="esi, or combined: P(wrong) from ESI and the answer's free signals."),
    ] = ScoreName.esi,
    fit_fraction: Annotated[
        float,
        typer.Option(help="Combined: share of the answers it is fitted on (the rest choose)."),
    ] = 0.5,
) -> None:
    """Score a labelled QA set with ESI, report metrics, and write a threshold file."""
    if score is ScoreName.combined and min_variants is not None:
        console.print("[red]error:[/red] --score combined and --min-variants: choose one")
        raise typer.Exit(2)
    guard, run = score_run(
        lambda: _guard(model, api_base, api_mode, device, runner, chat_template,
                       intervention.value, n_variants, top_k, distance, max_new_tokens, 0,
                       dtype),
        data, (question_field, answers_field, incorrect_field), limit=limit, seed=seed,
        labeller=lambda: _labeller(labels, label_threshold, judge), cache=cache,
        system=system, prompt_file=prompt, batch_size=batch_size,
    )  # fmt: skip
    examples, digest, labeller, scores, wrong = (
        run.examples, run.digest, run.labeller, run.scores, run.wrong
    )  # fmt: skip
    metrics = report(run, data, resamples)
    combined = None
    if score is ScoreName.combined:
        combined = _combined(run, fit_fraction, seed or 0)
        scores, wrong = combined.p_wrong, combined.wrong  # the threshold is chosen on these
    choice = _select(select, scores, wrong, alpha=alpha, delta=delta, coverage=coverage)
    if choice is None:
        console.print(
            f"[red]no threshold meets selective risk <= {alpha:g} with probability >= "
            f"{1 - delta:g} on these {len(scores)} examples; no threshold file written.[/red] "
            "Raise --alpha, raise --delta, or calibrate on more examples."
        )
        raise typer.Exit(1)
    sequential = None
    if min_variants is not None:
        sequential = _stop_rule(run.records, choice.threshold, min_variants, max_disagreement,
                                stop_delta)  # fmt: skip
    result = ThresholdFile(
        sequential=sequential,
        combined=combined and combined.model,
        combined_report=combined and combined.report,
        threshold=choice.threshold, method=choice.method, guarantee=choice.guarantee,
        calibration_coverage=choice.coverage,
        calibration_selective_risk=(
            None if math.isnan(choice.selective_risk) else choice.selective_risk
        ),
        model=guard.backend.model_id,
        scoring=scoring_config(guard, run.system, run.template),
        label_method=labeller.name,
        dataset=DatasetInfo(path=str(data), sha256=digest, n=len(examples), limit=limit,
                            seed=seed or 0),
        metrics={name: as_dict(e) for name, e in metrics.items()},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        esi_guard_version=__version__,
    )  # fmt: skip
    result.write(out)
    console.print(
        f"threshold {choice.threshold:.4f} ({choice.method}): calibration coverage "
        f"{choice.coverage:.3f}, selective risk {choice.selective_risk:.3f}"
    )
    if choice.guarantee:
        console.print(f"guarantee: {choice.guarantee['statement']}")
    console.print(f"wrote {out}")
    if plot is not None:
        from esi_guard.calibration.plot import plot_calibration

        plot_calibration(
            plot,
            scores,
            wrong,
            threshold=choice.threshold,
            title=f"{'P(wrong)' if combined else 'ESI'} on {data.parent.name}/{data.name}",
        )
        console.print(f"wrote {plot}")


def _combined(run: Run, fraction: float, seed: int) -> Combined:
    """Fit the combined score on part of the run; say how it does on the rest."""
    try:
        combined = fit_on_part([r for r in run.records if r["scored"]], run.wrong,
                               fraction=fraction, seed=seed)  # fmt: skip
    except ESIGuardError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    report = combined.report
    console.print(
        f"combined score: fitted on {report['n_fit']} answers; on the other "
        f"{report['n_select']} (threshold chosen there): ECE {report['ece']:.3f}, AUROC "
        f"[95% CI] P(wrong) {Estimate(**report['auroc_p_wrong'])} vs ESI "
        f"{Estimate(**report['auroc_esi'])}"
    )
    return combined


def _select(
    select: Selection, scores: list[float], wrong: list[int], *, alpha: float, delta: float,
    coverage: float,
) -> Choice | None:  # fmt: skip
    if select is Selection.risk:
        return by_risk(scores, wrong, alpha, delta)
    if select is Selection.coverage:
        return by_coverage(scores, wrong, coverage)
    if select is Selection.f1:
        return by_f1(scores, wrong)
    return by_youden(scores, wrong)


@app.command()
def evaluate(
    threshold: Annotated[Path, typer.Option("--threshold", help="A threshold file.")],
    data: Data,
    question_field: QuestionField = None,
    answers_field: AnswersField = None,
    incorrect_field: IncorrectField = None,
    limit: Limit = None,
    seed: Seed = None,
    model: Model = "default",
    api_base: ApiBase = None,
    api_mode: ApiMode = "auto",
    device: Device = None,
    dtype: DType = None,
    runner: Runner = LocalBackend.transformers,
    chat_template: ChatTemplateOption = None,
    labels: Labels = LabelMethod.containment,
    label_threshold: LabelThreshold = None,
    judge: Judge = None,
    cache: Cache = None,
    batch_size: BatchSize = 8,
    resamples: Resamples = 1000,
) -> None:
    """Metrics, realised coverage and selective risk of a threshold file on another set."""
    try:
        calibrated = ThresholdFile.read(threshold)
    except ESIGuardError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    _, run = score_run(
        lambda: ESIGuard.from_calibration(
            threshold,
            backend=_backend(model, api_base, api_mode, device, runner, chat_template, dtype),
        ),
        data, (question_field, answers_field, incorrect_field), limit=limit, seed=seed,
        labeller=lambda: _labeller(labels, label_threshold, judge), cache=cache,
        system=calibrated.scoring.system_prompt or "", prompt_file=None, batch_size=batch_size,
        template=calibrated.scoring.prompt_template,
    )  # fmt: skip
    scores, wrong = run.scores, run.wrong
    report(run, data, resamples)
    if calibrated.combined is not None:  # the threshold is on P(wrong)
        scores = [float(r["p_wrong"]) for r in run.records if r["scored"]]
        ece = expected_calibration_error(scores, wrong)
        estimate = bootstrap(auroc, scores, wrong, n_resamples=resamples)
        console.print(f"P(wrong): AUROC [95% CI] {estimate}, ECE {ece:.3f}")
    accepted = [w for s, w in zip(scores, wrong, strict=True) if s <= calibrated.threshold]
    realised_risk = sum(accepted) / len(accepted) if accepted else float("nan")
    console.print(
        f"threshold {calibrated.threshold:.4f} ({calibrated.method}): coverage "
        f"{len(accepted) / len(scores):.3f}, selective risk {realised_risk:.3f}"
        + (f" (unscored, withheld: {run.unscored})" if run.unscored else "")
    )
    if calibrated.guarantee:
        console.print(f"calibrated guarantee: {calibrated.guarantee['statement']}")


def main() -> None:
    """Entry point of the ``esi-guard`` command."""
    app()
