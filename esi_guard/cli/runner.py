"""Scoring a labelled set with a guard, in batches, with a JSONL cache that resumes.

Each scored example is appended to the cache as one JSON line as soon as its batch is done;
the first line, the header, records what the run is: what was asked for (``request``: the
command's model and scoring options, its prompts), the dataset hash, and what the loaded
model turned out to be (``model``, ``engine``, ``model_sha256``, the full ``scoring``
configuration). A rerun with the same cache skips the examples already there, so a run
killed halfway resumes where it stopped; a cache whose scores were computed otherwise
(another model, engine, scoring or data; the request aside) is refused rather than mixed
in, and a cache from before headers had a ``version`` is refused by name.

A rerun that finds every example in a cache written for the same request and data needs
no model at all (:func:`complete_cache`): the header says everything a threshold file
records about the model. Labels are written into the records after each run
(:func:`write_labels`): ``labels`` maps each label method's name to right (true) or
wrong (false), so the labels a threshold rests on can be audited beside the answers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from langchain_core.runnables import Runnable

from esi_guard.calibration.calibrate_combined import encode_states
from esi_guard.calibration.data import Example
from esi_guard.combined import CombinedScore
from esi_guard.exceptions import ConfigurationError, ESIGuardError
from esi_guard.guard import ESIGuard
from esi_guard.result import ScoringConfig

__all__ = [
    "CACHE_KIND",
    "CACHE_VERSION",
    "complete_cache",
    "donor_cache",
    "fill_states",
    "run_header",
    "score_examples",
    "scoring_config",
    "write_labels",
]

CACHE_KIND = "esi-guard/calibration-cache"
CACHE_VERSION = 2
"""2: the header has ``version``, ``request``, ``engine`` and ``model_sha256``."""


def run_header(
    guard: ESIGuard,
    dataset_sha256: str,
    system_prompt: str | None,
    template: str | None = None,
    request: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What identifies a run: a cache is only reused by a run with the same header.

    ``request`` is what the command was asked for (JSON values), known before any model
    is loaded; the rest comes from the guard and its backend.
    """
    header = {
        "kind": CACHE_KIND,
        "version": CACHE_VERSION,
        "request": request or {},
        "dataset_sha256": dataset_sha256,
        "model": guard.backend.model_id,
        "engine": guard.backend.engine,
        "model_sha256": guard.backend.model_sha256,
        "scoring": scoring_config(guard, system_prompt, template).model_dump(),
    }
    if guard.hidden_states is not None:
        spec = guard.hidden_states
        header["hidden_states"] = {"layers": list(spec.layers), "positions": list(spec.positions)}
    return header


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


def _load(path: Path) -> tuple[dict[str, Any], dict[int, dict[str, Any]]] | None:
    """A cache's header and records by index; None when there is no cache yet."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open(encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    try:
        first = json.loads(lines[0])
    except (json.JSONDecodeError, IndexError) as exc:
        msg = f"{path} is not a calibration cache"
        raise ConfigurationError(msg) from exc
    if not isinstance(first, dict) or first.get("kind") != CACHE_KIND:
        msg = f"{path} is not a calibration cache"
        raise ConfigurationError(msg)
    if first.get("version") != CACHE_VERSION:
        msg = (
            f"the cache {path} was written by an older esi-guard (its header has no engine "
            "or request); delete it or use another --cache path"
        )
        raise ConfigurationError(msg)
    done: dict[int, dict[str, Any]] = {}
    for line in lines[1:]:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill: that example is scored again
        done[int(record["index"])] = record
    return first, done


def _read_cache(path: Path, header: dict[str, Any]) -> dict[int, dict[str, Any]]:
    found = _load(path)
    if found is None:
        path.write_text(json.dumps(header) + "\n", encoding="utf-8")
        return {}
    first, done = found
    if _identity(first) != _identity(header):
        msg = (
            f"the cache {path} belongs to another run (model, scoring or data differ); "
            "use another --cache path or delete it"
        )
        raise ConfigurationError(msg)
    return done


def _identity(header: dict[str, Any]) -> dict[str, Any]:
    """What the scores depend on: all but the request (two requests may score alike)."""
    return {key: value for key, value in header.items() if key != "request"}


def complete_cache(
    path: Path, request: dict[str, Any], dataset_sha256: str, n: int
) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
    """The header and ``n`` records of a finished cache for this request and data, or None.

    None when there is no such cache or examples are missing from it: then the model is
    needed. A cache of another request or data set is left for :func:`score_examples` to
    refuse once the model is loaded.
    """
    found = _load(path)
    if found is None:
        return None
    header, done = found
    if header.get("request") != request or header.get("dataset_sha256") != dataset_sha256:
        return None
    if any(i not in done for i in range(n)):
        return None
    return header, [done[i] for i in range(n)]


def write_labels(path: Path, records: Sequence[dict[str, Any]]) -> None:
    """Rewrite the cache's records (their ``labels`` included), its header unchanged.

    The new file replaces the old one at once, so a kill leaves one or the other.
    """
    with path.open(encoding="utf-8") as handle:
        header = handle.readline()
    partial = path.with_suffix(".partial" + path.suffix)  # esi-cache-*.jsonl: ignored too
    with partial.open("w", encoding="utf-8") as out:
        out.write(header if header.endswith("\n") else header + "\n")
        for record in records:
            out.write(json.dumps(record) + "\n")
    os.replace(partial, path)


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
            messages = _answer(guard, examples, chunk, system_prompt, template)
            for index, message in zip(chunk, messages, strict=True):
                record = _record(index, examples[index], message)
                done[index] = record
                out.write(json.dumps(record) + "\n")
            out.flush()
            if on_batch is not None:
                on_batch(len(chunk))
    return [done[i] for i in range(len(examples))]


def _answer(
    guard: ESIGuard, examples: Sequence[Example], chunk: Sequence[int],
    system_prompt: str | None, template: str | None,
) -> list[Any]:  # fmt: skip
    """The guard's messages (or exceptions) for the examples ``chunk``, asked as a run asks."""
    if template is None:
        inputs: list[Any] = [_prompt(examples[i].question, system_prompt) for i in chunk]
        return guard.batch(inputs, return_exceptions=True)
    runnable = _templated(guard, system_prompt, template)
    return runnable.batch([_variables(examples[i]) for i in chunk], return_exceptions=True)


_READER = CombinedScore(features=("nll",), mean=(0.0,), scale=(1.0,), weights=(0.0,),
                        intercept=0.0, strength=0.0, n_fit=0)  # fmt: skip
"""A combined score that reads no ESI: a guard with it answers and reads the states
without forcing any variant (:func:`fill_states`; its decision is not used)."""


def donor_cache(
    paths: Sequence[Path], header: dict[str, Any]
) -> tuple[Path, dict[int, dict[str, Any]]] | None:
    """A cache of the same run without hidden states (the first of ``paths`` that is one).

    The same model, engine, scoring and data as ``header`` (a run that keeps states), its
    ``hidden_states`` aside: its answers and scores are what that run would compute.
    """
    wanted = {k: v for k, v in _identity(header).items() if k != "hidden_states"}
    for path in paths:
        found = _load(path) if path.exists() else None
        if found is not None and _identity(found[0]) == wanted:
            return path, found[1]
    return None


def fill_states(
    guard: ESIGuard,
    examples: Sequence[Example],
    donor: dict[int, dict[str, Any]],
    *,
    cache: Path,
    header: dict[str, Any],
    system_prompt: str | None = None,
    template: str | None = None,
    batch_size: int = 8,
) -> int:
    """Write ``donor``'s scored records into ``cache`` with their hidden states added.

    Each answer is generated again with its states read (no variant forced: ESI and the
    signals are the donor's); one whose answer comes out otherwise is left for full
    scoring. Returns how many records were written.
    """
    done = _read_cache(cache, header)
    todo = [i for i, r in sorted(donor.items())
            if i < len(examples) and i not in done and r.get("scored")]  # fmt: skip
    reader = guard.model_copy(update={"combined": _READER})
    written = 0
    with cache.open("a", encoding="utf-8") as out:
        if cache.read_bytes()[-1:] != b"\n":
            out.write("\n")
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            for index, message in zip(chunk, _answer(reader, examples, chunk, system_prompt,
                                                     template), strict=True):  # fmt: skip
                esi = getattr(message, "response_metadata", {}).get("esi") or {}
                if not esi.get("hidden") or esi.get("answer") != donor[index]["prediction"]:
                    continue
                record = {**donor[index], "hidden": encode_states(esi["hidden"])}
                out.write(json.dumps(record) + "\n")
                written += 1
            out.flush()
    return written


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
    if esi.get("hidden"):
        base["hidden"] = encode_states(esi["hidden"])
    if "decided_by" in esi:  # a cascade: which path decided, the probe's estimate
        base |= {"decided_by": esi["decided_by"], "probe_score": esi.get("probe_score")}
    return {**base, "prediction": esi["answer"], "score": esi["score"], "scored": esi["scored"],
            "reason": esi["reason"], "context_reliance": esi.get("context_reliance"),
            "variant_scores": esi.get("variant_scores"), "signals": esi.get("signals"),
            "p_wrong": esi.get("p_wrong"), "variants_used": esi.get("variants_used")}  # fmt: skip
