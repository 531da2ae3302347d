"""A labelled QA set scored resumably and labelled: what calibrate and evaluate report on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

from rich.table import Table

from esi_guard.calibration import labels as label_methods
from esi_guard.calibration.data import Example, dataset_hash, load_files
from esi_guard.calibration.metrics import Estimate, summarise, undefined_because
from esi_guard.calibration.prompts import run_prompts
from esi_guard.cli.output import console, data_name, fail, progress, shown_parts, warn
from esi_guard.cli.run.cache import (
    RunHeader,
    beside,
    complete_cache,
    default_cache,
    donor_cache,
    write_labels,
)
from esi_guard.cli.run.score import fill_states, score_chunk, score_with_progress
from esi_guard.exceptions import ESIGuardError
from esi_guard.guard import ESIGuard
from esi_guard.result import ScoringConfig

__all__ = ["Run", "Source", "metrics_table", "report", "score_run", "summary"]


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
    header: RunHeader
    """The cache's header: the model, engine, digest and scoring behind the scores."""

    @property
    def scoring(self) -> ScoringConfig:
        """The scoring configuration of the run, prompts included."""
        return self.header.scoring


class Source(NamedTuple):
    """What to score: the data files and how to read them."""

    data: list[Path]
    fields: tuple[str | None, str | None, str | None]
    """Question, answers and known wrong answers fields (None: recognised by format)."""
    limit: int | None
    seed: int | None
    answers_sep: str


def _label(
    records: list[dict[str, Any]], examples: list[Example], labeller: Any
) -> tuple[list[float], list[int], int]:
    """Scores and wrong labels of the scored examples, the unscored count; sets their ``labels``."""
    usable = [(r, e) for r, e in zip(records, examples, strict=True) if r["scored"]]
    right = labeller.label(
        [e.question for _, e in usable], [r["prediction"] for r, _ in usable],
        [e.answers for _, e in usable], [e.incorrect for _, e in usable],
    )  # fmt: skip
    for (record, _), ok in zip(usable, right, strict=True):
        record["labels"] = {**record.get("labels", {}), labeller.name: bool(ok)}
    return (  # an answer decided without ESI (decided_by "free") on its p_wrong
        [float(r["p_wrong"] if r["score"] is None else r["score"]) for r, _ in usable],
        [int(not ok) for ok in right],
        len(records) - len(usable),
    )


def _reuse(
    guard: ESIGuard, examples: list[Example], header: RunHeader, source: Source,
    request: dict[str, Any], digest: str, given: Path | None, cache: Path,
    system: str | None, template: str | None, batch_size: int,
) -> Path:  # fmt: skip
    """A run that keeps hidden states reuses a run without them: only the states computed.

    The donor: the default cache without states, or ``--cache`` (the run then writes beside it,
    ``-hidden`` added). Returns the cache the run writes to.
    """
    plain = {key: value for key, value in request.items() if key != "hidden_states"}
    paths = [p for p in (given, default_cache(source.data, plain, digest)) if p is not None]
    found = donor_cache(paths, header)
    if found is None:
        return cache
    donor_path, donor = found
    if donor_path == cache:
        cache = beside(cache)
    written = fill_states(guard, examples, donor, cache=cache, header=header,
                          system_prompt=system, template=template,
                          batch_size=batch_size)  # fmt: skip
    if written:
        console.print(
            f"{written} answers and their scores reused from {donor_path}: only their "
            f"hidden states computed (no variant forced); the run continues in {cache}"
        )
    return cache


def score_run(
    guard: Callable[[], ESIGuard],
    source: Source,
    *,
    request: dict[str, Any],
    labeller: Callable[[], Any],
    cache: Path | None,
    system: str | None,
    prompt_file: Path | None,
    batch_size: int,
    template: str | None = None,
    workers: int | None = None,
    ray_address: str | None = None,
    worker_cpus: float = 1.0,
) -> Run:
    """Load, score (resumably) and label; an error or a missing extra ends it with code 2.

    ``guard`` is only called when the cache for this ``request`` lacks an example. ``workers``:
    that many Ray actors (:class:`esi_guard.ray.ScoringPool`) score the batches, same records.
    """
    try:
        question_field, answers_field, incorrect_field = source.fields
        examples = load_files(
            source.data, question_field=question_field, answers_field=answers_field,
            incorrect_field=incorrect_field, limit=source.limit, seed=source.seed,
            answers_sep=source.answers_sep,
        )  # fmt: skip
        system, template = run_prompts(examples, system, prompt_file, template)
        digest = dataset_hash(examples)
        the_labeller = labeller()  # before scoring: a bad --judge fails at once
        if any(not e.answerable for e in examples):
            the_labeller = label_methods.Declines(the_labeller)
        request = {**request, "system_prompt": system, "prompt_template": template}
        given = cache
        cache = cache or default_cache(source.data, request, digest)
        found = complete_cache(cache, request, digest, len(examples))
        if found is None and given is not None and not request.get("hidden_states"):
            # a finished run that kept the states holds this run's answers and scores too
            found = complete_cache(given, {**request, "hidden_states": True}, digest,
                                   len(examples))  # fmt: skip
        if found is None and given is not None and request.get("hidden_states"):
            hidden_cache = beside(given)  # where a run reusing --cache's answers wrote
            found = complete_cache(hidden_cache, request, digest, len(examples))
            cache = hidden_cache if found is not None else cache
        if found is not None:
            header, records = found
            console.print(f"all {len(records)} examples found in {cache}: no model loaded")
        elif workers:
            from esi_guard.ray import ScoringPool

            progress(f"starting {workers} Ray workers, each loading the model...")
            score = partial(score_chunk, system_prompt=system, template=template)
            with ScoringPool(guard, workers, examples=examples, score=score,
                             worker_cpus=worker_cpus, address=ray_address) as pool:  # fmt: skip
                header = pool.call(partial(RunHeader.of, dataset_sha256=digest,
                                           system_prompt=system, template=template,
                                           request=request))  # fmt: skip
                records = score_with_progress(None, examples, cache=cache, header=header,
                                              system=system, template=template,
                                              batch_size=batch_size, pool=pool)  # fmt: skip
            console.print(f"per-example results: {cache} (scored on {workers} Ray workers)")
        else:
            progress("loading the model...")
            the_guard = guard()
            header = RunHeader.of(the_guard, digest, system, template, request)
            if header.hidden_states is not None:
                cache = _reuse(the_guard, examples, header, source, request, digest, given,
                               cache, system, template, batch_size)  # fmt: skip
            records = score_with_progress(the_guard, examples, cache=cache, header=header,
                                          system=system, template=template,
                                          batch_size=batch_size)  # fmt: skip
            console.print(f"per-example results: {cache}")
        scores, wrong, unscored = _label(records, examples, the_labeller)
        write_labels(cache, records)
    except (ESIGuardError, ImportError) as exc:  # ImportError: an extra to install, named
        fail(str(exc))
    if not scores:
        fail("no example could be scored")
    return Run(examples, digest, the_labeller, scores, wrong, unscored, system, template,
               records, header)  # fmt: skip


def summary(
    scores: Sequence[float], wrong: Sequence[int], resamples: int, unit: str = "answers",
    clusters: Sequence[int] | None = None,
) -> dict[str, Estimate]:  # fmt: skip
    """Every metric with its interval, bootstrapped (whole ``clusters`` if given), saying so."""
    drawn = f"{len(scores)} {unit}" if clusters is None else (
        f"the {len(set(clusters))} answers of {len(scores)} {unit}")  # fmt: skip
    progress(f"bootstrapping 95% intervals ({resamples} resamples of {drawn})...")
    return summarise(scores, wrong, n_resamples=resamples, clusters=clusters)


def report(run: Run, data: Sequence[Path], resamples: int) -> dict[str, Estimate]:
    """Print ESI's metrics table (and how many examples were unscored); return the metrics."""
    metrics = summary(run.scores, run.wrong, resamples)
    accuracy = 1 - sum(run.wrong) / len(run.wrong)
    title = (
        f"ESI on {data_name(data)}: n={len(run.scores)}, accuracy {accuracy:.3f}, "
        f"labels {run.labeller.name}"
    )
    console.print(metrics_table(metrics, title, run.wrong))
    if run.unscored:
        warn(f"{run.unscored} example(s) could not be scored and are left out")
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


def metrics_table(metrics: dict[str, Estimate], title: str, wrong: Sequence[int]) -> Table:
    """The metrics as a table; one these labels leave undefined reads ``n/a (why)``."""
    why = undefined_because(wrong)
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_column("95% bootstrap CI", justify="right")
    for name, estimate in metrics.items():
        table.add_row(name, *shown_parts(estimate, why))
    return table
