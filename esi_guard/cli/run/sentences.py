"""A labelled QA set asked ``k`` questions at a time, scored and labelled per sentence.

Each prompt numbers its questions and asks one sentence each
(:mod:`esi_guard.calibration.long_answers`); only the questions are intervened on. Each sentence
gets its score (``ESIResult.sentences``) and, aligned to its question, its label. Records are
cached one per prompt, so a killed run resumes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esi_guard.calibration.data import Example, dataset_hash
from esi_guard.calibration.long_answers import (
    LongPrompt,
    group_closed_book,
    group_rag,
    label_sentences,
)
from esi_guard.cli.output import console, progress
from esi_guard.cli.run.cache import RunHeader, complete_cache, default_cache, open_cache
from esi_guard.cli.run.score import appending, renderer_for
from esi_guard.guard import ESIGuard
from esi_guard.result import ESIResult

__all__ = ["SentenceRun", "grouped", "score_sentence_run"]


@dataclass(frozen=True)
class SentenceRun:
    """The prompts' records and their labelled sentences: what a sentence threshold is chosen on."""

    prompts: list[LongPrompt]
    records: list[dict[str, Any]]
    header: RunHeader
    digest: str

    @property
    def answers(self) -> list[tuple[list[float], list[bool]]]:
        """Per scored answer, its labelled sentences' scores and whether each is wrong."""
        out = []
        for record in self.records:
            kept = [s for s in record["sentences"] if s["right"] is not None]
            out.append(([s["score"] for s in kept], [not s["right"] for s in kept]))
        return out

    @property
    def flat(self) -> tuple[list[float], list[int], list[int]]:
        """Every labelled sentence's score, wrong label (1) and prompt index."""
        scores, wrong, prompts = [], [], []
        for record in self.records:
            for sentence in record["sentences"]:
                if sentence["right"] is not None:
                    scores.append(sentence["score"])
                    wrong.append(int(not sentence["right"]))
                    prompts.append(record["index"])
        return scores, wrong, prompts

    def report(self) -> dict[str, Any]:
        """How many prompts, sentences, labelled and unaligned sentences, by alignment."""
        sentences = [s for r in self.records for s in r["sentences"]]
        labelled = [s for s in sentences if s["right"] is not None]
        return {
            "prompts": len(self.prompts),
            "scored_prompts": sum(bool(r["scored"]) for r in self.records),
            "questions_per_prompt": len(self.prompts[0].examples) if self.prompts else 0,
            "sentences": len(sentences),
            "labelled": len(labelled),
            "unaligned": len(sentences) - len(labelled),
            "right": sum(bool(s["right"]) for s in labelled),
            "aligned_by": dict(Counter(s["how"] for s in labelled)),
        }


def grouped(examples: Sequence[Example], k: int) -> list[LongPrompt]:
    """The set's questions, ``k`` to a prompt (per passage for a set with passages)."""
    if any(e.context is not None for e in examples):
        return group_rag(examples, k)
    return group_closed_book(examples, k)


def _record(index: int, prompt: LongPrompt, result: ESIResult | BaseException) -> dict[str, Any]:
    """A prompt's record: the answer, its score and each sentence's score and label."""
    if not isinstance(result, ESIResult) or not result.scored:
        answer = result.answer if isinstance(result, ESIResult) else None
        why = (
            result.reason if isinstance(result, ESIResult) else f"{type(result).__name__}: {result}"
        )
        return {"index": index, "scored": False, "reason": why, "sentences": [],
                "answer": answer, "score": None}  # fmt: skip
    spans = [(s.start, s.end) for s in result.sentences]
    labels = label_sentences(prompt, result.answer, spans)
    sentences = [
        {"text": s.text, "start": s.start, "end": s.end, "score": s.score,
         "signals": s.signals, "question": label.question, "how": label.how,
         "right": label.right}
        for s, label in zip(result.sentences, labels, strict=True)
    ]  # fmt: skip
    return {"index": index, "scored": True, "answer": result.answer, "score": result.score,
            "signals": result.signals, "sentences": sentences}  # fmt: skip


def score_sentence_run(
    guard: Callable[[], ESIGuard],
    examples: list[Example],
    k: int,
    *,
    request: dict[str, Any],
    data: Sequence[Path],
    cache: Path | None,
    system: str | None,
    batch_size: int,
) -> SentenceRun:
    """Group, score (resumably) and label; a complete cache for the same request loads no model."""
    prompts = grouped(examples, k)
    digest = dataset_hash(examples)
    template = prompts[0].template if prompts else None
    request = {**request, "system_prompt": system, "granularity": "sentence",
               "questions_per_prompt": k}  # fmt: skip
    cache = cache or default_cache(data, request, digest)
    found = complete_cache(cache, request, digest, len(prompts))
    if found is not None:
        header, records = found
        console.print(f"all {len(records)} prompts found in {cache}: no model loaded")
        return SentenceRun(prompts, records, header, digest)
    progress("loading the model...")
    the_guard = guard()
    header = RunHeader.of(the_guard, digest, system, template, request)
    done = open_cache(cache, header)
    todo = [i for i in range(len(prompts)) if i not in done]
    renderer = renderer_for(system, template, "questions") if template else None
    with appending(cache) as handle:
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            assert renderer is not None  # prompts to score: a template
            rendered = [renderer.render(prompts[i].variables()) for i in chunk]
            results = the_guard.assess(rendered, failures="return")
            for i, result in zip(chunk, results, strict=True):
                done[i] = _record(i, prompts[i], result)
                handle.write(json.dumps(done[i]) + "\n")
            handle.flush()
            progress(f"{len(done)}/{len(prompts)} prompts scored")
    console.print(f"per-prompt results: {cache}")
    return SentenceRun(prompts, [done[i] for i in range(len(prompts))], header, digest)
