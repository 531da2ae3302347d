"""``esi-guard calibrate``: score a labelled QA set, report it, and write a threshold file.

The threshold is on ESI, or with ``--score combined`` on a fitted P(wrong)
(:mod:`esi_guard.cli._combined`); ``--esi-probe`` fits a cascade's band beside it
(:mod:`esi_guard.cli._cascade`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from esi_guard import __version__
from esi_guard._retired import RETIRED
from esi_guard.calibration.calibrate_combined import Combined, parse_features
from esi_guard.calibration.file import DatasetInfo, ThresholdFile
from esi_guard.calibration.metrics import Estimate
from esi_guard.calibration.thresholds import (
    Choice,
    by_coverage,
    by_f1,
    by_risk,
    by_youden,
    min_accepted,
    min_examples,
    risk_search,
    risk_tests,
)
from esi_guard.cli import build
from esi_guard.cli._cascade import fit_cascade, read_probe
from esi_guard.cli._combined import CROSS_FITTED, explain, fit_run, headline, value_band
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
    Distance,
    DType,
    Granularity,
    IncorrectField,
    InterventionName,
    InterventionOption,
    Judge,
    LabelMethod,
    Labels,
    LabelThreshold,
    Limit,
    LocalBackend,
    MaxNewTokens,
    Model,
    NVariants,
    PromptFile,
    QuestionField,
    RayAddress,
    Resamples,
    Runner,
    ScoreName,
    Seed,
    Selection,
    System,
    Threads,
    TopK,
    Workers,
)
from esi_guard.cli.calibrate_sentences import calibrate_sentences
from esi_guard.cli.output import (
    check_classes,
    check_writable,
    console,
    data_name,
    fail,
    needs_extra,
    progress,
    stderr,
    used_modules,
    warn,
)
from esi_guard.cli.run import Run, Source, report, score_run
from esi_guard.combined import FEATURES, HIDDEN
from esi_guard.exceptions import ESIGuardError
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS

__all__ = ["SMALL_SET", "calibrate"]

SMALL_SET = 100
"""Fewer scored examples than this get a warning, whatever the rule."""


def calibrate(
    data: Data,
    out: Annotated[Path, typer.Option(help="Where to write the threshold file (JSON).")],
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
    intervention: InterventionOption = InterventionName.soc,
    n_variants: NVariants = 10,
    top_k: TopK = 100,
    distance: Distance = "hellinger",
    max_new_tokens: MaxNewTokens = DEFAULT_MAX_NEW_TOKENS,
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
        int | None, typer.Option(hidden=True, help="Retired in 0.2.0 (sequential ESI).")
    ] = None,
    max_disagreement: Annotated[
        float, typer.Option(help="Cascade: most decisions differing from full-ESI ones.")
    ] = 0.05,
    stop_delta: Annotated[
        float, typer.Option(help="Cascade: allowed failure probability of that bound.")
    ] = 0.1,
    esi_probe: Annotated[
        Path | None,
        typer.Option(help="An ESI probe (esi-guard distill): fit the cascade's band too."),
    ] = None,
    score: Annotated[
        ScoreName,
        typer.Option(help="esi, or combined: P(wrong) from ESI and the answer's free signals."),
    ] = ScoreName.esi,
    fit_fraction: Annotated[
        float | None,
        typer.Option(help="Combined: fit on this share of the answers, choose the threshold "
                     "on the rest (default: cross-fit on all, choose out of fold)."),
    ] = None,
    cascade: Annotated[
        bool,
        typer.Option("--cascade", help="Combined with esi: also fit it without ESI and the "
                     "band where ESI can change the decision; the guard runs ESI only there."),
    ] = False,
    features: Annotated[
        str,
        typer.Option(help="Combined: its signals, of esi, nll, entropy, max_nll, repetition, "
                     "and hidden (a probe on the model's hidden states; transformers or "
                     "llama.cpp); cross-fitting keeps those that pay."),
    ] = ",".join(FEATURES),
    granularity: Annotated[
        Granularity,
        typer.Option(help="answer: a threshold on whole answers; sentence: on each sentence, "
                     "the questions asked --questions-per-prompt at a time, one sentence each, "
                     "every sentence labelled (with --select risk, conformal back-off)."),
    ] = Granularity.answer,
    questions_per_prompt: Annotated[
        int, typer.Option(help="--granularity sentence: questions asked in one prompt.")
    ] = 3,
    workers: Workers = None,
    ray_address: RayAddress = None,
) -> None:  # fmt: skip
    """Score a labelled QA set with ESI, report metrics, and write a threshold file."""
    if min_variants is not None:
        fail(RETIRED["min_variants"])
    _check_targets(select, alpha, delta, coverage)
    build.local_threads(threads, api_base, dtype=dtype, device=device, runner=runner)
    check_writable(out, "--out")
    check_writable(plot, "--plot")
    if granularity is Granularity.sentence:
        if workers:
            fail("--workers scores whole answers: not with --granularity sentence")
        _check_sentence_options(score, esi_probe, prompt, labels, questions_per_prompt)
        for given, option in (
            (plot is not None, "--plot"),
            (cascade, "--cascade"),
            (features != ",".join(FEATURES), "--features"),
            (fit_fraction is not None, "--fit-fraction"),
        ):
            if given:
                fail(f"--granularity sentence decides on each sentence's ESI: not with {option}")
        chosen = build.ModelOptions(model, api_base, api_mode, device, runner, chat_template,
                                    dtype, threads)  # fmt: skip
        scoring = build.ScoringOptions(intervention.value, n_variants, top_k, distance,
                                       max_new_tokens)  # fmt: skip
        calibrate_sentences(
            lambda: build.guard(chosen, scoring), data, out, k=questions_per_prompt,
            request={**chosen.request(), **scoring.request()},
            load={"question_field": question_field, "answers_field": answers_field,
                  "incorrect_field": incorrect_field, "answers_sep": answers_sep},
            limit=limit, seed=seed, system=system, cache=cache, batch_size=batch_size,
            select=select, targets={"alpha": alpha, "delta": delta},
            rule=partial(_select, select, alpha=alpha, delta=delta, coverage=coverage),
            resamples=resamples,
        )  # fmt: skip
        return
    fits = score is ScoreName.combined or esi_probe is not None
    needs_extra("calibrate", used_modules(labels=labels.value, plot=plot is not None, fits=fits))
    names = _check_fits(score, features, cascade, fit_fraction, esi_probe)
    probe = None if esi_probe is None else read_probe(esi_probe)
    hidden = HIDDEN in names or probe is not None
    chosen = build.ModelOptions(model, api_base, api_mode, device, runner, chat_template, dtype,
                                build.worker_threads(threads, workers, api_base))  # fmt: skip
    scoring = build.ScoringOptions(intervention.value, n_variants, top_k, distance,
                                   max_new_tokens)  # fmt: skip
    request = {**chosen.request(), **scoring.request()}
    if hidden:
        request["hidden_states"] = True  # another cache: its records carry the states
    run = score_run(
        lambda: build.guard(chosen, scoring, hidden=hidden),
        Source(data, (question_field, answers_field, incorrect_field), limit, seed, answers_sep),
        request=request, labeller=lambda: build.labeller(labels, label_threshold, judge),
        cache=cache, system=system, prompt_file=prompt, batch_size=batch_size,
        workers=workers, ray_address=ray_address, worker_cpus=build.worker_cpus(chosen),
    )  # fmt: skip
    fit = None if score is ScoreName.esi else (fit_fraction, seed or 0, names, cascade)
    metrics, combined = _reported(run, data, resamples, fit)
    scores, wrong = (run.scores, run.wrong) if combined is None else (
        combined.p_wrong, combined.wrong)  # fmt: skip
    _warn_if_small(len(scores), select, alpha, delta)
    if select is Selection.coverage and combined is not None and combined.run_time_p:
        # A coverage needs no label: the share of the guard's own score under the threshold.
        choice: Choice | None = by_coverage(combined.run_time_p, wrong, coverage)
    else:
        choice = _select(select, scores, wrong, alpha=alpha, delta=delta, coverage=coverage)
    title = f"{'P(wrong)' if combined else 'ESI'} on {data_name(data)}"
    if choice is None:
        _refuse(scores, wrong, alpha, delta)
        if plot is not None:
            _plot(plot, scores, wrong, None, f"{title}: no threshold meets risk <= {alpha:g}")
        raise typer.Exit(1)
    dataset = DatasetInfo(path=", ".join(map(str, data)), sha256=run.digest,
                          n=len(run.examples), limit=limit, seed=seed)  # fmt: skip
    if combined is not None and choice.guarantee and combined.report["fit"] == "cross":
        statement = choice.guarantee["statement"] + CROSS_FITTED
        choice = replace(choice, guarantee={**choice.guarantee, "statement": statement})
    result = _threshold_file(run, choice, metrics, combined, dataset)
    if cascade and combined is not None and combined.free is None:
        console.print(f"no cascade: the kept score ({combined.report['chosen']}) reads no "
                      "ESI, so its guard forces no variant on any answer")  # fmt: skip
    elif cascade and combined is not None:
        result = result.model_copy(update=value_band(combined, choice.threshold,
                                                     max_disagreement, stop_delta))  # fmt: skip
    if probe is not None:
        progress("fitting the cascade's band on the ESI probe...")
        result = result.model_copy(update=fit_cascade(
            run, probe, choice.threshold, max_disagreement, stop_delta))  # fmt: skip
    result.write(out)
    console.print(
        f"threshold {choice.threshold:.4f} ({choice.method}): calibration coverage "
        f"{choice.coverage:.3f}, selective risk {_risk(choice)}"
    )
    if choice.guarantee:
        console.print(f"guarantee: {choice.guarantee['statement']}")
    console.print(f"decision policy: {result.policy.describe()}")
    console.print(f"wrote {out}")
    if plot is not None:
        _plot(plot, scores, wrong, choice.threshold, title)


def _reported(
    run: Run, data: list[Path], resamples: int,
    fit: tuple[float | None, int, tuple[str, ...], bool] | None,
) -> tuple[dict[str, Estimate], Combined | None]:  # fmt: skip
    """The tables after refusing a one-class set; with ``fit``, the combined score's come first."""
    check_classes(run.wrong)
    combined = None
    if fit is not None:
        fraction, seed, names, cascade = fit
        combined = fit_run(run, fraction, seed, names, cascade=cascade, resamples=resamples)
        headline(combined, run, data, resamples)
    metrics = report(run, data, resamples)
    if combined is not None:
        explain(combined, names)
        if combined.report["fit"] == "split":
            check_classes(combined.wrong, "held-out answers (the threshold is chosen on them)")
    return metrics, combined


def _risk(choice: Choice) -> str:
    """The chosen threshold's calibration risk, or why it has none (it accepts no answer)."""
    if math.isnan(choice.selective_risk):
        return "n/a (it accepts no calibration answer)"
    return f"{choice.selective_risk:.3f}"


def _check_sentence_options(
    score: ScoreName, esi_probe: Path | None, prompt: Path | None, labels: LabelMethod, k: int,
) -> None:  # fmt: skip
    """What --granularity sentence does not take ends the command before any model loads."""
    for given, option in (
        (score is not ScoreName.esi, "--score combined"),
        (esi_probe is not None, "--esi-probe"),
        (prompt is not None, "--prompt (the sentence prompts are built in)"),
        (labels is not LabelMethod.containment, "--labels other than containment"),
    ):
        if given:
            fail(f"--granularity sentence decides on each sentence's ESI: not with {option}")
    if not 1 <= k <= 9:
        fail(f"--questions-per-prompt must be 1 to 9, got {k}")


def _check_fits(
    score: ScoreName, features: str, cascade: bool, fit_fraction: float | None,
    esi_probe: Path | None,
) -> tuple[str, ...]:  # fmt: skip
    """The combined score's features; options that do not go together end the command."""
    try:
        names = parse_features(features)
    except ESIGuardError as exc:
        fail(str(exc))
    if score is not ScoreName.combined:
        for given, option in (
            (names != FEATURES, "--features"),
            (cascade, "--cascade"),
            (fit_fraction is not None, "--fit-fraction"),
        ):
            if given:
                fail(f"{option} is for --score combined")
    if score is ScoreName.combined and esi_probe is not None:
        fail(RETIRED["esi_probe_on_combined"])
    if cascade and (esi_probe is not None or fit_fraction is not None):
        fail(
            "--cascade cross-fits its band on every answer: not with --esi-probe or --fit-fraction"
        )
    return names


def _threshold_file(
    run: Run, choice: Choice, metrics: dict[str, Estimate], combined: Combined | None,
    dataset: DatasetInfo,
) -> ThresholdFile:  # fmt: skip
    """The file: the choice, and the model and scoring the run's cache header names."""
    return ThresholdFile.from_run(
        run.header, choice, label_method=run.labeller.name, dataset=dataset, metrics=metrics,
        version=__version__, combined=combined and combined.model,
        combined_report=combined and combined.report,
    )  # fmt: skip


def _check_targets(select: Selection, alpha: float, delta: float, coverage: float) -> None:
    """Bad targets end the command before any model is loaded."""
    if select is Selection.risk and not (0 < alpha < 1 and 0 < delta < 1):
        fail(f"--alpha and --delta must be in (0, 1), got {alpha:g} and {delta:g}")
    if select is Selection.coverage and not 0 < coverage <= 1:
        fail(f"--coverage must be in (0, 1], got {coverage:g}")


def _warn_if_small(m: int, select: Selection, alpha: float, delta: float) -> None:
    """A threshold chosen on few examples says so, whatever the rule."""
    if select is Selection.risk and m < min_examples(alpha, delta):
        warn(
            f"{m} scored examples: selective risk <= {alpha:g} with probability >= "
            f"{1 - delta:g} needs at least {min_examples(alpha, delta)} even if every answer "
            "is right; no threshold can qualify. Calibrate on more examples."
        )
    elif m < SMALL_SET:
        warn(
            f"only {m} scored examples: a threshold and metrics from so few move a lot from "
            "one sample to the next; calibrate on a few hundred of the questions you serve."
        )


def _refuse(scores: list[float], wrong: list[int], alpha: float, delta: float) -> None:
    """Say what failed when the risk rule found no threshold: the best bound it reached."""
    tested = risk_search(scores, wrong, alpha, delta)
    best = min(tested, key=lambda test: (test.bound, -test.accepted))
    tests, m = risk_tests(len(scores)), len(scores)
    needed, smallest = min_accepted(alpha, delta, tests), min_examples(alpha, delta)
    few = ""
    if m < smallest:
        few = (f" ({m} examples are too few: even with none wrong the rule needs at least "
               f"{smallest}, as its search tests the median score first)")  # fmt: skip
    elif best.accepted < needed:
        few = f" (even with none wrong, a bound that low needs at least {needed} accepted)"
    stderr.print(
        f"no threshold keeps the upper confidence bound of the accepted error rate at or "
        f"below alpha={alpha:g} with delta={delta:g} on these {m} examples: the best bound "
        f"is {best.bound:.3f} at {best.accepted} accepted ({best.errors} wrong, error rate "
        f"{best.errors / best.accepted:.3f}){few}, of the {len(tested)} thresholds "
        f"the search tested (Clopper-Pearson at delta/{tests} each); no threshold file "
        "written. Calibrate on more examples, raise --alpha, or raise --delta."
    )


def _plot(
    path: Path, scores: list[float], wrong: list[int], threshold: float | None, title: str
) -> None:
    progress(f"drawing {path}...")
    from esi_guard.calibration.plot import plot_calibration

    plot_calibration(path, scores, wrong, threshold=threshold, title=title)
    console.print(f"wrote {path}" + ("" if threshold is not None else
                                      " (no threshold line: no threshold qualified)"))  # fmt: skip


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
