"""What the ``esi-guard`` commands share: score a QA set resumably, label it, report it."""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

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

from esi_guard.calibration import labels as label_methods
from esi_guard.calibration.data import Example, dataset_hash, load_examples
from esi_guard.calibration.metrics import Estimate, summarise
from esi_guard.calibration.prompts import run_prompts
from esi_guard.calibration.runner import run_header, score_examples
from esi_guard.exceptions import ESIGuardError
from esi_guard.guard import ESIGuard

console = Console()


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


class Run(NamedTuple):
    """A QA set scored by a guard and labelled: what the commands report and choose on."""

    examples: list[Example]
    digest: str
    labeller: Any
    scores: list[float]
    wrong: list[int]
    unscored: int
    system: str | None
    template: str | None
    records: list[dict[str, Any]]


def score_run(
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
) -> tuple[ESIGuard, Run]:
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
    run = Run(examples, digest, the_labeller, scores, wrong, unscored, system, template, records)
    return the_guard, run


def report(run: Run, data: Path, resamples: int) -> dict[str, Estimate]:
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


def _by_answerability(run: Run) -> str:
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


def as_dict(estimate: Estimate) -> dict[str, float | None]:
    """An estimate as a threshold file stores it (NaN as None)."""
    return {
        key: None if math.isnan(value) else value
        for key, value in (
            ("value", estimate.value),
            ("low", estimate.low),
            ("high", estimate.high),
        )
    }
