"""Scoring examples with a guard into the run's cache a batch at a time, so a killed run resumes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TextIO

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from esi_guard.backends.hidden import HiddenStates
from esi_guard.calibration.calibrate_combined import encode_states
from esi_guard.calibration.data import Example
from esi_guard.cli.output import stderr
from esi_guard.cli.run.cache import Records, RunHeader, open_cache
from esi_guard.combined import CombinedScore
from esi_guard.exceptions import ESIGuardError
from esi_guard.guard import ESIGuard
from esi_guard.guard._templates import TemplatedPrompt
from esi_guard.result import ESIResult

__all__ = [
    "Pool",
    "appending",
    "fill_states",
    "renderer_for",
    "score_chunk",
    "score_examples",
    "score_with_progress",
]


Examples = Sequence[Example] | Mapping[int, Example]
"""A run's examples by index: all of them, or (in a worker) those of its batch."""


class Pool(Protocol):
    """Workers that score batches elsewhere (:class:`esi_guard.ray.ScoringPool`)."""

    def records(
        self, chunks: Sequence[list[int]]
    ) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
        """Each batch's records (:func:`score_chunk`), as the batches finish."""
        ...


_READER = CombinedScore(features=("nll",), mean=(0.0,), scale=(1.0,), weights=(0.0,),
                        intercept=0.0, strength=0.0, n_fit=0)  # fmt: skip
"""A score reading no ESI: its guard reads states, forcing no variant (:func:`fill_states`)."""


def _assess(
    guard: ESIGuard, examples: Examples, chunk: Sequence[int],
    system_prompt: str | None, template: str | None,
) -> list[ESIResult | BaseException]:  # fmt: skip
    """The guard's results (errors in place) for ``chunk``; a template varies only the question."""
    if template is None:
        prompts: list[Any] = [_prompt(examples[i].question, system_prompt) for i in chunk]
        return list(guard.assess(prompts))
    renderer = renderer_for(system_prompt, template)
    out: list[Any] = []
    for i in chunk:
        try:
            out.append(renderer.render(_variables(examples[i])))
        except Exception as exc:  # in the example's place, as batch returns it
            out.append(exc)
    rendered = [value for value in out if not isinstance(value, BaseException)]
    results = iter(guard.assess(rendered))
    return [value if isinstance(value, BaseException) else next(results) for value in out]


def renderer_for(
    system_prompt: str | None, template: str, question_key: str = "question"
) -> TemplatedPrompt:
    """``template`` (after ``system_prompt``) as a prompt intervened on ``question_key`` only.

    The system prompt is sent as text, not a template: a ``{question}`` in it is not the question.
    """
    from langchain_core.messages import SystemMessage
    from langchain_core.prompts import ChatPromptTemplate

    messages = [SystemMessage(content=system_prompt)] if system_prompt else []
    prompt = ChatPromptTemplate.from_messages([*messages, ("human", template)])
    return TemplatedPrompt(prompt=prompt, question_key=question_key)


def _prompt(question: str, system_prompt: str | None) -> list[tuple[str, str]]:
    return ([("system", system_prompt)] if system_prompt else []) + [("human", question)]


def _variables(example: Example) -> dict[str, str]:
    values = {"question": example.question}
    if example.context is not None:
        values["context"] = example.context
    return values


def appending(cache: Path) -> TextIO:
    """The cache opened to append, a line a kill cut short ended first."""
    out = cache.open("a", encoding="utf-8")
    if cache.read_bytes()[-1:] != b"\n":
        out.write("\n")  # so the next record starts clean
    return out


def score_chunk(
    guard: ESIGuard, examples: Examples, chunk: Sequence[int],
    system_prompt: str | None, template: str | None,
) -> list[dict[str, Any]]:  # fmt: skip
    """The records of the examples ``chunk``, scored as one batch."""
    results = _assess(guard, examples, chunk, system_prompt, template)
    return [_record(i, examples[i], r) for i, r in zip(chunk, results, strict=True)]


def score_examples(
    guard: ESIGuard | None,
    examples: Sequence[Example],
    *,
    cache: Path,
    header: RunHeader,
    system_prompt: str | None = None,
    template: str | None = None,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
    pool: Pool | None = None,
) -> list[dict[str, Any]]:
    """One record per example (index, question, answers, prediction, score, scored, reason).

    Those not in ``cache`` are scored in batches by ``guard`` or ``pool`` and written as each ends;
    ``on_batch(n)`` gets the count found in the cache, then each batch's.
    """
    done = open_cache(cache, header)
    if on_batch is not None:
        on_batch(len(done))
    todo = [i for i in range(len(examples)) if i not in done]
    chunks = [todo[start : start + batch_size] for start in range(0, len(todo), batch_size)]
    if pool is not None:
        scored = pool.records(chunks)
    elif guard is not None:
        scored = ((c, score_chunk(guard, examples, c, system_prompt, template)) for c in chunks)
    else:
        msg = "score_examples needs a guard or a pool"
        raise ValueError(msg)
    with appending(cache) as out:
        for chunk, records in scored:
            for index, record in zip(chunk, records, strict=True):
                done[index] = record
                out.write(json.dumps(record) + "\n")
            out.flush()
            if on_batch is not None:
                on_batch(len(chunk))
    return [done[i] for i in range(len(examples))]


def score_with_progress(
    guard: ESIGuard | None,
    examples: list[Example],
    *,
    cache: Path,
    header: RunHeader,
    system: str | None,
    template: str | None,
    batch_size: int,
    pool: Pool | None = None,
) -> list[dict[str, Any]]:
    """:func:`score_examples` under a progress bar on stderr (its rate: this run's answers)."""
    columns = (
        TextColumn("[bold]scoring"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"),
        TimeRemainingColumn(),
    )  # fmt: skip
    start, scored, resumed = time.monotonic(), 0, False
    with Progress(*columns, console=stderr) as progress:  # results stay alone on stdout
        task = progress.add_task("score", total=len(examples), rate="")

        def advance(count: int) -> None:
            nonlocal scored, resumed
            if resumed:  # the first call reports what the cache already held
                scored += count
            resumed = True
            rate = scored / max(time.monotonic() - start, 1e-9)
            progress.update(task, advance=count, rate=f"{rate:.2f} q/s" if scored else "")

        return score_examples(
            guard, examples, cache=cache, header=header, system_prompt=system,
            template=template, batch_size=batch_size, on_batch=advance, pool=pool,
        )  # fmt: skip


def fill_states(
    guard: ESIGuard,
    examples: Sequence[Example],
    donor: Records,
    *,
    cache: Path,
    header: RunHeader,
    system_prompt: str | None = None,
    template: str | None = None,
    batch_size: int = 8,
) -> int:
    """Write ``donor``'s scored records into ``cache`` with their hidden states added.

    Answers are generated again to read states (no variant forced); one that comes out otherwise
    is left for full scoring. Returns how many records were written.
    """
    done = open_cache(cache, header)
    todo = [i for i, r in sorted(donor.items())
            if i < len(examples) and i not in done and r.get("scored")]  # fmt: skip
    reader = guard.model_copy(update={"combined": _READER})
    written = 0
    with appending(cache) as out:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            results = _assess(reader, examples, chunk, system_prompt, template)
            for index, result in zip(chunk, results, strict=True):
                if not isinstance(result, ESIResult) or result.hidden is None:
                    continue
                if result.answer != donor[index]["prediction"]:
                    continue
                record = {**donor[index], "hidden": _encoded(result.hidden)}
                out.write(json.dumps(record) + "\n")
                written += 1
            out.flush()
    return written


def _encoded(hidden: HiddenStates) -> dict[str, Any]:
    """The states as a cache line keeps them (:func:`encode_states`)."""
    return encode_states({"layers": hidden.layers, "positions": hidden.positions,
                          "values": hidden.values})  # fmt: skip


def _record(index: int, example: Example, result: ESIResult | BaseException) -> dict[str, Any]:
    base: dict[str, Any] = {"index": index, "question": example.question,
                            "answers": list(example.answers)}  # fmt: skip
    if example.context is not None:
        base["answerable"] = example.answerable
    if isinstance(result, ESIGuardError):
        return {**base, "prediction": None, "score": None, "scored": False,
                "reason": f"{type(result).__name__}: {result}"}  # fmt: skip
    if isinstance(result, BaseException):
        raise result
    if result.hidden is not None:
        base["hidden"] = _encoded(result.hidden)
    if result.decided_by is not None:  # a cascade: which path decided, the probe's estimate
        base |= {"decided_by": result.decided_by, "probe_score": result.probe_score}
    return {**base, "prediction": result.answer, "score": result.score,
            "scored": result.scored, "reason": result.reason,
            "variant_scores": list(result.variant_scores), "signals": dict(result.signals),
            "p_wrong": result.p_wrong, "variants_used": result.variants_used}  # fmt: skip
