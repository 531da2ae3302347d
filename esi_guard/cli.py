r"""``esi-guard``: calibrate a threshold on labelled QA data, and evaluate one on another set.

    esi-guard calibrate --data ../shared/data/triviaqa/subset.jsonl --limit 300 \\
        --out threshold.json --plot calibration.png --cache triviaqa.jsonl
    esi-guard evaluate --threshold threshold.json --data ../shared/data/sciq/test.jsonl

Needs the ``cli`` extra (typer, rich, scikit-learn, scipy, matplotlib, the packaged
all-MiniLM-L6-v2) and a backend's extra (``hf`` for local models, ``api`` for servers).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from esi_guard import __version__
from esi_guard.backends.adapters import local_backend
from esi_guard.backends.base import Backend
from esi_guard.calibration import labels as label_methods
from esi_guard.calibration.combining import Combined, fit_on_part
from esi_guard.calibration.data import Example, dataset_hash, load_examples
from esi_guard.calibration.file import DatasetInfo, ThresholdFile
from esi_guard.calibration.metrics import Estimate, auroc, expected_calibration_error, summarise
from esi_guard.calibration.prompts import run_prompts
from esi_guard.calibration.runner import run_header, score_examples, scoring_config
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
console = Console()


class LabelMethod(str, Enum):
    """How correctness is decided."""

    containment = "containment"
    exact = "exact"
    f1 = "f1"
    semantic = "semantic"
    judge = "judge"


class ScoreName(str, Enum):
    """What the threshold applies to."""

    esi = "esi"
    combined = "combined"


class Selection(str, Enum):
    """How the threshold is chosen."""

    risk = "risk"
    coverage = "coverage"
    f1 = "f1"
    youden = "youden"


class LocalBackend(str, Enum):
    """What runs a local model (``--model default``, a folder, a hub id or a ``.gguf`` file)."""

    transformers = "transformers"
    llamacpp = "llamacpp"


class InterventionName(str, Enum):
    """Character-level interventions available from the command line."""

    soc = "soc"
    typo = "typo"


# -- shared options ---------------------------------------------------------------------

Data = Annotated[Path, typer.Option("--data", help="QA file (JSONL/CSV; shared formats known).")]
QuestionField = Annotated[str | None, typer.Option(help="Question field of other formats.")]
AnswersField = Annotated[str | None, typer.Option(help="Gold answers field of other formats.")]
IncorrectField = Annotated[
    str | None,
    typer.Option(help="Known wrong answers field, used by semantic/judge labels (optional)."),
]
Limit = Annotated[int | None, typer.Option(help="Use the first N examples (after --seed).")]
Seed = Annotated[int | None, typer.Option(help="Shuffle the examples with this seed first.")]
Model = Annotated[
    str, typer.Option(help="'default' (embedded SmolLM2), a HF id/path or .gguf file.")
]
ApiBase = Annotated[str | None, typer.Option(help="OpenAI-compatible server URL (API backend).")]
ApiMode = Annotated[str, typer.Option(help="API backend mode: echo, chat or auto.")]
Device = Annotated[str | None, typer.Option(help="Device for local models (cpu, cuda...).")]
ChatTemplateOption = Annotated[
    str | None,
    typer.Option(
        "--chat-template",
        help="A Jinja chat template file overriding the model's, or 'completion' for a base "
        "model that has none (the messages' text, then 'Answer:').",
    ),
]
Runner = Annotated[
    LocalBackend,
    typer.Option(
        "--backend",
        help="What runs a local model: transformers (faster on many questions in batches) "
        "or llamacpp (a .gguf file or 'default'; loads in a second, answers faster, forces "
        "variants slower on CPUs).",
    ),
]
Cache = Annotated[
    Path | None, typer.Option(help="JSONL cache of per-example results; reruns resume from it.")
]
BatchSize = Annotated[int, typer.Option(help="Questions per batched guard call.")]
System = Annotated[
    str | None,
    typer.Option(
        help="System prompt before each question ('' for none). Default: a short-answer "
        "instruction for closed-book data, none with a --prompt template or passage data."
    ),
]
PromptFile = Annotated[
    Path | None,
    typer.Option(
        "--prompt",
        help="Template file with {question} (and {context} for data with passages, such as "
        "SQuAD 2.0); only {question} is intervened on. Default for passage data: the "
        "built-in RAG template.",
    ),
]
Labels = Annotated[LabelMethod, typer.Option(help="Correctness labels.")]
LabelThreshold = Annotated[
    float | None, typer.Option(help="Threshold of f1 (0.5) or semantic (0.7) labels.")
]
Judge = Annotated[
    str | None, typer.Option(help="module:attribute of a LangChain chat model, for --labels judge.")
]
Resamples = Annotated[int, typer.Option(help="Bootstrap resamples for the intervals.")]


def _backend(
    model: str, api_base: str | None, api_mode: str, device: str | None,
    runner: LocalBackend = LocalBackend.transformers, chat_template: str | None = None,
) -> Backend:  # fmt: skip
    if api_base:
        from esi_guard.backends.openai import OpenAIBackend

        return OpenAIBackend(model, base_url=api_base, mode=api_mode)  # type: ignore[arg-type]
    template = chat_template
    if template is not None and template != "completion":
        template = Path(template).read_text(encoding="utf-8")
    return local_backend(model, engine=runner.value, device=device, chat_template=template)


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


def _score(
    guard: ESIGuard,
    examples: list[Example],
    *,
    cache: Path | None,
    system: str | None,
    template: str | None,
    batch_size: int,
    digest: str,
    data: Path,
) -> list[dict[str, Any]]:
    header = run_header(guard, digest, system, template)
    if cache is None:  # in the working directory, never beside the (shared) data
        run_id = hashlib.sha256(json.dumps(header, sort_keys=True).encode()).hexdigest()[:12]
        cache = Path(f"esi-cache-{data.stem}-{run_id}.jsonl")
    columns = (
        TextColumn("[bold]scoring"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
        TimeRemainingColumn(),
    )  # fmt: skip
    start, scored, resumed = time.monotonic(), 0, False
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("score", total=len(examples), rate="")

        def advance(count: int) -> None:
            nonlocal scored, resumed
            if resumed:  # the first call reports what the cache already held
                scored += count
            resumed = True
            rate = scored / max(time.monotonic() - start, 1e-9)
            progress.update(task, advance=count, rate=f"{rate:.2f} q/s" if scored else "")

        records = score_examples(
            guard, examples, cache=cache, header=header, system_prompt=system,
            template=template, batch_size=batch_size, on_batch=advance,
        )  # fmt: skip
    console.print(f"per-example results: {cache}")
    return records


def _label(
    records: list[dict[str, Any]], examples: list[Example], labeller: Any
) -> tuple[list[float], list[int], int]:
    """Scores and wrong-answer labels of the scored examples, and how many were unscored."""
    usable = [(r, e) for r, e in zip(records, examples, strict=True) if r["scored"]]
    right = labeller.label(
        [e.question for _, e in usable], [r["prediction"] for r, _ in usable],
        [e.answers for _, e in usable], [e.incorrect for _, e in usable],
    )  # fmt: skip
    return (
        [float(r["score"]) for r, _ in usable],
        [int(not ok) for ok in right],
        len(records) - len(usable),
    )


class _Run(NamedTuple):
    examples: list[Example]
    digest: str
    labeller: Any
    scores: list[float]
    wrong: list[int]
    unscored: int
    system: str | None
    template: str | None
    records: list[dict[str, Any]]


def _run(
    guard: Callable[[], ESIGuard],
    data: Path,
    fields: tuple[str | None, str | None, str | None],
    *,
    limit: int | None,
    seed: int | None,
    labeller: Callable[[], Any],
    cache: Path | None,
    system: str | None,
    prompt_file: Path | None,
    batch_size: int,
    template: str | None = None,
) -> tuple[ESIGuard, _Run]:
    """Load, score (resumably) and label; any esi_guard error ends the command with code 2."""
    try:
        question_field, answers_field, incorrect_field = fields
        examples = load_examples(
            data, question_field=question_field, answers_field=answers_field,
            incorrect_field=incorrect_field, limit=limit, seed=seed,
        )  # fmt: skip
        system, template = run_prompts(examples, system, prompt_file, template)
        digest = dataset_hash(examples)
        the_guard, the_labeller = guard(), labeller()
        if any(not e.answerable for e in examples):
            the_labeller = label_methods.Declines(the_labeller)
        records = _score(the_guard, examples, cache=cache, system=system, template=template,
                         batch_size=batch_size, digest=digest, data=data)  # fmt: skip
        scores, wrong, unscored = _label(records, examples, the_labeller)
    except ESIGuardError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if not scores:
        console.print("[red]error:[/red] no example could be scored")
        raise typer.Exit(2)
    run = _Run(examples, digest, the_labeller, scores, wrong, unscored, system, template, records)
    return the_guard, run


def _report(run: _Run, data: Path, resamples: int) -> dict[str, Estimate]:
    """Print the metrics table (and how many examples were unscored); return the metrics."""
    metrics = summarise(run.scores, run.wrong, n_resamples=resamples)
    accuracy = 1 - sum(run.wrong) / len(run.wrong)
    console.print(_metrics_table(metrics, f"ESI on {data.name}: n={len(run.scores)}, accuracy "
                                 f"{accuracy:.3f}, labels {run.labeller.name}"))  # fmt: skip
    if run.unscored:
        console.print(
            f"[yellow]{run.unscored} example(s) could not be scored and are left out[/yellow]"
        )
    if any(not e.answerable for e in run.examples):
        console.print(_by_answerability(run))
    return metrics


def _by_answerability(run: _Run) -> str:
    """Accuracy on answerable and unanswerable questions apart (scored examples)."""
    scored = [e for e, r in zip(run.examples, run.records, strict=True) if r["scored"]]
    parts = []
    for name, answerable in (("answerable", True), ("unanswerable (declined)", False)):
        wrong = [w for e, w in zip(scored, run.wrong, strict=True) if e.answerable is answerable]
        if wrong:
            parts.append(f"{name}: {1 - sum(wrong) / len(wrong):.3f} of {len(wrong)}")
    return "accuracy " + "; ".join(parts)


def _metrics_table(metrics: dict[str, Estimate], title: str) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% bootstrap CI", justify="right")
    for name, estimate in metrics.items():
        table.add_row(name, f"{estimate.value:.3f}", f"[{estimate.low:.3f}, {estimate.high:.3f}]")
    return table


def _as_dict(estimate: Estimate) -> dict[str, float | None]:
    return {
        key: None if math.isnan(value) else value
        for key, value in (
            ("value", estimate.value),
            ("low", estimate.low),
            ("high", estimate.high),
        )
    }


def _guard(
    model: str, api_base: str | None, api_mode: str, device: str | None, runner: LocalBackend,
    chat_template: str | None, intervention: str, n_variants: int, top_k: int, distance: str,
    max_new_tokens: int, seed: int,
) -> ESIGuard:  # fmt: skip
    backend = _backend(model, api_base, api_mode, device, runner, chat_template)
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
    guard, run = _run(
        lambda: _guard(model, api_base, api_mode, device, runner, chat_template,
                       intervention.value, n_variants, top_k, distance, max_new_tokens, 0),
        data, (question_field, answers_field, incorrect_field), limit=limit, seed=seed,
        labeller=lambda: _labeller(labels, label_threshold, judge), cache=cache,
        system=system, prompt_file=prompt, batch_size=batch_size,
    )  # fmt: skip
    examples, digest, labeller, scores, wrong = (
        run.examples, run.digest, run.labeller, run.scores, run.wrong
    )  # fmt: skip
    metrics = _report(run, data, resamples)
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
        metrics={name: _as_dict(e) for name, e in metrics.items()},
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


def _combined(run: _Run, fraction: float, seed: int) -> Combined:
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
        f"P(wrong) {report['auroc_p_wrong']:.3f} vs ESI {report['auroc_esi']:.3f}"
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
    _, run = _run(
        lambda: ESIGuard.from_calibration(
            threshold, backend=_backend(model, api_base, api_mode, device, runner, chat_template)
        ),
        data, (question_field, answers_field, incorrect_field), limit=limit, seed=seed,
        labeller=lambda: _labeller(labels, label_threshold, judge), cache=cache,
        system=calibrated.scoring.system_prompt or "", prompt_file=None, batch_size=batch_size,
        template=calibrated.scoring.prompt_template,
    )  # fmt: skip
    scores, wrong = run.scores, run.wrong
    _report(run, data, resamples)
    if calibrated.combined is not None:  # the threshold is on P(wrong)
        scores = [float(r["p_wrong"]) for r in run.records if r["scored"]]
        ece = expected_calibration_error(scores, wrong)
        console.print(f"P(wrong): AUROC {auroc(scores, wrong):.3f}, ECE {ece:.3f}")
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
