"""Scoring a labelled set with a guard, in batches, with a JSONL cache that resumes.

Each scored example is appended to the cache as one JSON line as soon as its batch is done;
the first line records what the run is (model, scoring configuration, dataset hash, system
prompt). A rerun with the same cache skips the examples already there, so a run killed
halfway resumes where it stopped; a cache made by a different run is refused rather than
mixed in.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.runnables import Runnable

from esi_guard.calibration.data import Example
from esi_guard.exceptions import ConfigurationError, ESIGuardError
from esi_guard.guard import ESIGuard
from esi_guard.result import ScoringConfig

__all__ = ["run_header", "score_examples"]


def run_header(
    guard: ESIGuard, dataset_sha256: str, system_prompt: str | None, template: str | None = None
) -> dict[str, Any]:
    """What identifies a run: a cache is only reused by a run with the same header."""
    return {
        "kind": "esi-guard/calibration-cache",
        "model": guard.backend.model_id,
        "scoring": scoring_config(guard, system_prompt, template).model_dump(),
        "dataset_sha256": dataset_sha256,
    }


def scoring_config(
    guard: ESIGuard, system_prompt: str | None, template: str | None = None
) -> ScoringConfig:
    """The guard's scoring configuration with the run's prompts, as the file records it."""
    return guard.scoring_config.model_copy(
        update={"system_prompt": system_prompt, "prompt_template": template}
    )


def _templated(guard: ESIGuard, system_prompt: str | None, template: str) -> Runnable[Any, Any]:
    from langchain_core.prompts import ChatPromptTemplate

    messages = [("system", system_prompt)] if system_prompt else []
    prompt = ChatPromptTemplate.from_messages([*messages, ("human", template)])
    context = "context" if "context" in prompt.input_variables else None
    return guard.with_prompt(prompt, "question", context_key=context)


def _read_cache(path: Path, header: dict[str, Any]) -> dict[int, dict[str, Any]]:
    if not path.exists() or path.stat().st_size == 0:
        path.write_text(json.dumps(header) + "\n", encoding="utf-8")
        return {}
    done: dict[int, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    try:
        first = json.loads(lines[0])
    except (json.JSONDecodeError, IndexError) as exc:
        msg = f"{path} is not a calibration cache"
        raise ConfigurationError(msg) from exc
    if first != header:
        msg = (
            f"the cache {path} belongs to another run (model, scoring or data differ); "
            "use another --cache path or delete it"
        )
        raise ConfigurationError(msg)
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill: that example is scored again
        done[int(record["index"])] = record
    return done


def _prompt(question: str, system_prompt: str | None) -> list[tuple[str, str]]:
    return ([("system", system_prompt)] if system_prompt else []) + [("human", question)]


def score_examples(
    guard: ESIGuard,
    examples: Sequence[Example],
    *,
    cache: Path,
    header: dict[str, Any],
    system_prompt: str | None = None,
    template: str | None = None,
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """One record per example (index, question, answers, prediction, score, scored, reason).

    Examples already in ``cache`` are not scored again. ``on_batch(n)`` is called after
    each batch with the number of examples it added (for a progress bar); it is also
    called once at the start with the number found in the cache. With ``template`` each
    example is rendered through ``guard.with_prompt`` (``{question}``, and ``{context}``
    from the example's passage), so only the question is intervened on.
    """
    done = _read_cache(cache, header)
    if on_batch is not None:
        on_batch(len(done))
    todo = [i for i in range(len(examples)) if i not in done]
    with cache.open("a", encoding="utf-8") as out:
        if cache.read_bytes()[-1:] != b"\n":
            out.write("\n")  # end a line a kill cut short, so the next record starts clean
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            if template is None:
                inputs: list[Any] = [_prompt(examples[i].question, system_prompt) for i in chunk]
                messages = guard.batch(inputs, return_exceptions=True)
            else:
                inputs = [_variables(examples[i]) for i in chunk]
                runnable = _templated(guard, system_prompt, template)
                messages = runnable.batch(inputs, return_exceptions=True)
            for index, message in zip(chunk, messages, strict=True):
                record = _record(index, examples[index], message)
                done[index] = record
                out.write(json.dumps(record) + "\n")
            out.flush()
            if on_batch is not None:
                on_batch(len(chunk))
    return [done[i] for i in range(len(examples))]


def _variables(example: Example) -> dict[str, str]:
    values = {"question": example.question}
    if example.context is not None:
        values["context"] = example.context
    return values


def _record(index: int, example: Example, message: Any) -> dict[str, Any]:
    base = {"index": index, "question": example.question, "answers": list(example.answers)}
    if example.context is not None:
        base["answerable"] = example.answerable
    if isinstance(message, ESIGuardError):
        return {**base, "prediction": None, "score": None, "scored": False,
                "reason": f"{type(message).__name__}: {message}"}  # fmt: skip
    if isinstance(message, BaseException):
        raise message
    esi = message.response_metadata["esi"]
    return {**base, "prediction": esi["answer"], "score": esi["score"], "scored": esi["scored"],
            "reason": esi["reason"], "context_reliance": esi.get("context_reliance"),
            "variant_scores": esi.get("variant_scores"), "signals": esi.get("signals"),
            "p_wrong": esi.get("p_wrong")}  # fmt: skip
