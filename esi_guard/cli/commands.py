r"""``esi-guard``: calibrate a threshold on labelled QA data, and evaluate one on another set.

    esi-guard calibrate --data docs/examples/my_qa.jsonl --select risk --alpha 0.35 \\
        --out threshold.json --plot calibration.png
    esi-guard calibrate --data data/sciq/test.jsonl \\
        --data data/triviaqa/subset.jsonl --limit 200 --select coverage \\
        --out threshold.json
    esi-guard evaluate --threshold threshold.json --data data/sciq/test.jsonl

Needs the ``cli`` extra (typer, rich, scikit-learn, scipy, matplotlib, the packaged
all-MiniLM-L6-v2) and a backend's extra (``hf`` or ``llamacpp`` for local models, ``api``
for servers). Results go to stdout; errors and warnings to stderr (an error exits 2, a
risk target no threshold meets exits 1).
"""

from __future__ import annotations

import hashlib
import importlib
import math
import os
import sys
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import typer

from esi_guard import __version__
from esi_guard.backends.adapters import auto_engine, local_backend
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import FINAL, HiddenSpec
from esi_guard.calibration import labels as label_methods
from esi_guard.calibration.calibrate_combined import Combined, parse_features
from esi_guard.calibration.file import DatasetInfo, ThresholdFile
from esi_guard.calibration.metrics import Estimate, auroc, bootstrap, expected_calibration_error
from esi_guard.calibration.thresholds import (
    Choice,
    by_coverage,
    by_f1,
    by_risk,
    by_youden,
    fit_stop_constant,
    min_accepted,
    min_examples,
    risk_search,
    risk_tests,
)
from esi_guard.cli._cascade import fit_cascade, read_probe
from esi_guard.cli._combined import CROSS_FITTED, fit_run, value_band
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
    Threads,
)
from esi_guard.cli._run import (
    Run,
    Source,
    as_dict,
    console,
    data_name,
    fail,
    needs_extra,
    report,
    score_run,
    stderr,
    used_modules,
    warn,
)
from esi_guard.combined import FEATURES, HIDDEN, probe_window
from esi_guard.exceptions import ESIGuardError
from esi_guard.guard import ESIGuard
from esi_guard.interventions import SkipOneChar, Typo
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS

SMALL_SET = 100
"""Fewer scored examples than this get a warning, whatever the rule."""
_INTERVENTIONS = {"soc": SkipOneChar, "typo": Typo}

HELP = (
    "Guard LLM answers with the ESI uncertainty score. calibrate scores a labelled QA set "
    "and writes a threshold file; evaluate measures one on another set; distill fits an "
    "ESI probe on unlabelled questions; serve runs the guard as an OpenAI-compatible "
    "server; env reports this machine's setup for bug reports. Run esi-guard COMMAND "
    "--help for a command's options."
)
"""The top-level help: plain text (no markup), naming every command."""

app = typer.Typer(add_completion=False, no_args_is_help=True, help=HELP)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"esi-guard {__version__}")
        raise typer.Exit


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option("--version", help="Print the version and exit.", is_eager=True,
                     callback=_version),
    ] = False,
) -> None:  # fmt: skip
    """The options before a command (the help is :data:`HELP`)."""


def _backend(
    model: str, api_base: str | None, api_mode: str, device: str | None,
    runner: LocalBackend = LocalBackend.auto, chat_template: str | None = None,
    dtype: str | None = None, threads: int | None = None,
) -> Backend:  # fmt: skip
    if api_base:
        from esi_guard.backends.openai import OpenAIBackend

        return OpenAIBackend(model, base_url=api_base, mode=api_mode)  # type: ignore[arg-type]
    engine = None if runner is LocalBackend.auto else runner.value
    return local_backend(model, engine=engine, device=device, n_threads=threads,
                         chat_template=_template_text(chat_template), dtype=dtype)  # fmt: skip


def local_threads(threads: int | None, server: str | None, option: str = "--api-base") -> None:
    """``--threads`` is for a model run here: with a server's URL the command ends at once."""
    if threads is not None and server:
        fail(f"--threads sets the CPU threads of a model run here; {option} {server} runs it")


def _template_text(chat_template: str | None) -> str | None:
    """The chat template's source (``completion`` and None as they are)."""
    if chat_template is None or chat_template == "completion":
        return chat_template
    try:
        return Path(chat_template).read_text(encoding="utf-8")
    except OSError as exc:
        fail(f"cannot read the chat template {chat_template}: {exc.strerror}")


def _model_request(
    model: str, api_base: str | None, api_mode: str, device: str | None, runner: LocalBackend,
    chat_template: str | None, dtype: str | None,
) -> dict[str, Any]:  # fmt: skip
    """The options that choose the model, as the cache header records them (no loading)."""
    template = _template_text(chat_template)
    if template not in (None, "completion"):
        template = "sha256:" + hashlib.sha256(template.encode()).hexdigest()
    if api_base:
        return {"model": model, "api_base": api_base, "api_mode": api_mode,
                "chat_template": template}  # fmt: skip
    engine = runner.value
    if runner is LocalBackend.auto:
        engine = auto_engine(model, device=device, dtype=dtype)
    return {"model": model, "engine": engine, "dtype": dtype, "chat_template": template}


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
    max_new_tokens: int, seed: int, dtype: str | None = None, hidden: bool = False,
    threads: int | None = None,
) -> ESIGuard:  # fmt: skip
    """The guard a run scores with; ``hidden``: it keeps the probe's candidate states."""
    backend = _backend(model, api_base, api_mode, device, runner, chat_template, dtype, threads)
    states = None
    if hidden:
        if backend.hidden_layers is None:
            backend.check_hidden(HiddenSpec((FINAL,)))  # the backend's own refusal
        states = probe_window(backend.hidden_layers or ())
    return ESIGuard(
        backend=backend, threshold=0.0, intervention=_INTERVENTIONS[intervention](),  # unused
        n_variants=n_variants, top_k=top_k, distance=distance,
        max_new_tokens=max_new_tokens, seed=seed, hidden_states=states,
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
        warn(
            f"sequential ESI: no stopping constant keeps early decisions within "
            f"{most:g} of the full-L ones with probability >= {1 - delta:g} on these "
            f"{len(rows)} answers; the file holds no stopping rule. Raise "
            "--max-disagreement or calibrate on more examples."
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
    intervention: Annotated[InterventionName, typer.Option()] = InterventionName.soc,
    n_variants: Annotated[int, typer.Option(help="L, variants per question.")] = 10,
    top_k: Annotated[int, typer.Option(help="k, tokens kept per distribution.")] = 100,
    distance: Annotated[
        str, typer.Option(help="hellinger, squared_hellinger, kl...")
    ] = "hellinger",
    max_new_tokens: Annotated[
        int, typer.Option(help="Most tokens per answer (the guard's default too).")
    ] = DEFAULT_MAX_NEW_TOKENS,
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
        typer.Option(help="Sequential / cascade: most decisions differing from full-L ones."),
    ] = 0.05,
    stop_delta: Annotated[
        float, typer.Option(help="Sequential / cascade: allowed failure probability of that bound.")
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
) -> None:  # fmt: skip
    """Score a labelled QA set with ESI, report metrics, and write a threshold file."""
    _check_targets(select, alpha, delta, coverage)
    local_threads(threads, api_base)
    fits = score is ScoreName.combined or esi_probe is not None
    needs_extra("calibrate", used_modules(labels=labels.value, plot=plot is not None, fits=fits))
    if score is ScoreName.combined and min_variants is not None:
        fail("--score combined and --min-variants: choose one")
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
    if cascade and (esi_probe is not None or fit_fraction is not None):
        fail(
            "--cascade cross-fits its band on every answer: not with --esi-probe or --fit-fraction"
        )
    probe = None if esi_probe is None else read_probe(esi_probe)
    hidden = HIDDEN in names or probe is not None
    request = {
        **_model_request(model, api_base, api_mode, device, runner, chat_template, dtype),
        "intervention": _INTERVENTIONS[intervention.value]().describe(), "n_variants": n_variants,
        "top_k": top_k, "distance": distance, "max_new_tokens": max_new_tokens,
    }  # fmt: skip
    if hidden:
        request["hidden_states"] = True  # another cache: its records carry the states
    run = score_run(
        lambda: _guard(model, api_base, api_mode, device, runner, chat_template,
                       intervention.value, n_variants, top_k, distance, max_new_tokens, 0,
                       dtype, hidden, threads),
        Source(data, (question_field, answers_field, incorrect_field), limit, seed, answers_sep),
        request=request, labeller=lambda: _labeller(labels, label_threshold, judge),
        cache=cache, system=system, prompt_file=prompt, batch_size=batch_size,
    )  # fmt: skip
    scores, wrong = run.scores, run.wrong
    metrics = report(run, data, resamples)
    combined = None
    if score is ScoreName.combined:
        combined = fit_run(run, fit_fraction, seed or 0, names, cascade=cascade,
                           resamples=resamples)  # fmt: skip
        scores, wrong = combined.p_wrong, combined.wrong  # the threshold is chosen on these
    _warn_if_small(len(scores), select, alpha, delta)
    choice = _select(select, scores, wrong, alpha=alpha, delta=delta, coverage=coverage)
    title = f"{'P(wrong)' if combined else 'ESI'} on {data_name(data)}"
    if choice is None:
        _refuse(scores, wrong, alpha, delta)
        if plot is not None:
            _plot(plot, scores, wrong, None, f"{title}: no threshold meets risk <= {alpha:g}")
        raise typer.Exit(1)
    sequential = None
    if min_variants is not None:
        sequential = _stop_rule(run.records, choice.threshold, min_variants, max_disagreement,
                                stop_delta)  # fmt: skip
    dataset = DatasetInfo(path=", ".join(map(str, data)), sha256=run.digest,
                          n=len(run.examples), limit=limit, seed=seed or 0)  # fmt: skip
    if combined is not None and choice.guarantee and combined.report["fit"] == "cross":
        statement = choice.guarantee["statement"] + CROSS_FITTED
        choice = replace(choice, guarantee={**choice.guarantee, "statement": statement})
    result = _threshold_file(run, choice, metrics, combined, sequential, dataset)
    if cascade and combined is not None and combined.free is None:
        console.print(f"no cascade: the kept score ({combined.report['chosen']}) reads no "
                      "ESI, so its guard forces no variant on any answer")  # fmt: skip
    elif cascade and combined is not None:
        result = result.model_copy(update=value_band(combined, choice.threshold,
                                                     max_disagreement, stop_delta))  # fmt: skip
    if probe is not None:
        result = result.model_copy(update=fit_cascade(
            run, probe, choice.threshold, combined, max_disagreement, stop_delta))  # fmt: skip
    result.write(out)
    console.print(
        f"threshold {choice.threshold:.4f} ({choice.method}): calibration coverage "
        f"{choice.coverage:.3f}, selective risk {choice.selective_risk:.3f}"
    )
    if choice.guarantee:
        console.print(f"guarantee: {choice.guarantee['statement']}")
    console.print(f"wrote {out}")
    if plot is not None:
        _plot(plot, scores, wrong, choice.threshold, title)


def _threshold_file(
    run: Run, choice: Choice, metrics: dict[str, Estimate], combined: Combined | None,
    sequential: dict[str, Any] | None, dataset: DatasetInfo,
) -> ThresholdFile:  # fmt: skip
    """The file: the choice, and the model and scoring the run's cache header names."""
    return ThresholdFile(
        sequential=sequential,
        combined=combined and combined.model,
        combined_report=combined and combined.report,
        threshold=choice.threshold, method=choice.method, guarantee=choice.guarantee,
        calibration_coverage=choice.coverage,
        calibration_selective_risk=(
            None if math.isnan(choice.selective_risk) else choice.selective_risk
        ),
        model=run.header["model"], engine=run.header["engine"],
        model_sha256=run.header["model_sha256"], scoring=run.scoring,
        label_method=run.labeller.name, dataset=dataset,
        metrics={name: as_dict(e) for name, e in metrics.items()},
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        esi_guard_version=__version__,
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


@app.command()
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
) -> None:
    """Metrics, realised coverage and selective risk of a threshold file on another set."""
    local_threads(threads, api_base)
    needs_extra("evaluate", used_modules(labels=labels.value))
    try:
        calibrated = ThresholdFile.read(threshold)
    except ESIGuardError as exc:
        fail(str(exc))
    request = {
        **_model_request(model, api_base, api_mode, device, runner, chat_template, dtype),
        "threshold": calibrated.model_dump(mode="json",
                                           include={"scoring", "sequential", "combined",
                                                    "esi_probe", "probe_band", "free_score"}),
    }  # fmt: skip
    run = score_run(
        lambda: ESIGuard.from_calibration(
            threshold,
            backend=_backend(model, api_base, api_mode, device, runner, chat_template, dtype,
                             threads),
        ),
        Source(data, (question_field, answers_field, incorrect_field), limit, seed, answers_sep),
        request=request, labeller=lambda: _labeller(labels, label_threshold, judge),
        cache=cache, system=calibrated.scoring.system_prompt or "", prompt_file=None,
        batch_size=batch_size, template=calibrated.scoring.prompt_template,
    )  # fmt: skip
    scores, wrong = run.scores, run.wrong
    if all(r["score"] is not None for r in run.records if r["scored"]):
        report(run, data, resamples)
    else:  # some decided without ESI: there is no ESI score to report on
        console.print(f"{data_name(data)}: n={len(wrong)}, accuracy "
                      f"{1 - sum(wrong) / len(wrong):.3f}, labels {run.labeller.name}")  # fmt: skip
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
    paths = [r["decided_by"] for r in run.records if r.get("decided_by")]
    if paths and calibrated.combined is not None and not calibrated.combined.uses_esi:
        console.print(f"no ESI: {len(paths)} answers decided on P(wrong), no variant forced")
    elif paths:
        console.print(
            f"cascade: full ESI ran on {paths.count('esi')} of {len(paths)} answers "
            f"({paths.count('esi') / len(paths):.1%}); the cheap score decided the others"
        )


QUIET = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
"""Environment that silences other libraries' progress bars (tqdm, the model hub, and
transformers, which reads the hub's switch on import): the command draws its own."""


def quiet_third_party() -> None:
    """Silence other libraries' progress bars, unless the environment already decides."""
    for name, value in QUIET.items():
        os.environ.setdefault(name, value)
    if "transformers" in sys.modules:  # imported already: its switch was read
        from transformers.utils import logging

        logging.disable_progress_bar()  # type: ignore[no-untyped-call]


def main() -> None:
    """Entry point of the ``esi-guard`` command."""
    quiet_third_party()
    app()
