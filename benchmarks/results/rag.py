r"""The RAG half of ``benchmarks/results/run.py``: SQuAD 2.0 passages with their questions.

    python -m benchmarks.results.run --data ../shared/data/squad2/dev.json --limit 1000 \\
        --json squad2.json --cache .bench-cache --shard 0/2      # and 1/2 beside it

Every question is asked with the CLI's RAG template (``esi_guard.calibration.prompts.RAG_TEMPLATE``:
passage first, then the question, "I don't know" to decline) as one human message, and
scored the ways a guard could score it, on the same greedy answer:

* ``ESI(SOC) question only``: the guard's own path with ``with_prompt``: the template
  rendered again with only the question variable intervened on (L=10, k=100, Hellinger);
* ``ESI(SOC) whole message``: the old path (a plain ``prompt | guard``): SOC over the whole
  human message, instructions and passage included;
* ``context reliance``: the answer forced once after the prompt with the passage emptied;
  a *low* reliance is the warning sign, so it is ranked as ``1 - reliance``. This
  measurement retired the package's ``decide_on="context_reliance"`` in 0.2.0; the
  benchmark renders the prompt without its passage itself (:func:`without_passage`);
* the free signals (greedy NLL, mean token entropy) and, from 10 samples at T=1, LN-PE,
  lexical similarity, semantic entropy and SAR (as in ``run.py``). P(True) is left out:
  its prompt has no passage.

Labels (:class:`~esi_guard.calibration.labels.Declines`): an unanswerable question is
right only when declined; an answerable one when not declined and a gold answer is
contained in the reply. Two targets: wrong-vs-right, and unanswerable-vs-answerable.

Each question's scores and stage times go to a JSONL cache as soon as its batch is done
(``--cache``, :mod:`benchmarks.cache`), so a run resumes and can be split over processes
(``--shard k/n``; a shard skips what any shard has scored, so a run can be re-split); the
report reads every shard's cache.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.prompts import PromptTemplate

from benchmarks.baselines import (
    lexical_similarity,
    ln_pe,
    mean_token_entropy,
    neg_log_likelihood,
    semantic_entropy,
    sentence_sar,
)
from benchmarks.cache import Cache
from benchmarks.common import Clock, token_logprobs
from esi_guard import HFBackend, SkipOneChar, esi_score
from esi_guard.backends import ChatMessage, ForcingRequest
from esi_guard.backends.sampling import Sample, sample
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.labels import Declines, Semantic, declined
from esi_guard.calibration.metrics import auroc, bootstrap, paired_difference
from esi_guard.calibration.prompts import RAG_TEMPLATE
from esi_guard.guard import (
    GuardedPrompt,
    Item,
    Pipeline,
    Rule,
    TemplatedPrompt,
    Work,
    chat_messages,
)
from esi_guard.policy import Policy
from esi_guard.result import ESIResult, ScoringConfig

L, K = 10, 100
N_SAMPLES, TEMPERATURE, SE_THRESHOLD = 10, 1.0, 0.8
FREE = ("NLL (greedy)", "mean token entropy", "LN-PE")
"""The signals a RAG app gets (nearly) for free; ESI must beat the best of them."""
ESI_Q = "ESI(SOC) question only"
ESI_W = "ESI(SOC) whole message"
RELIANCE = "context reliance (1 - reliance)"


def _pipeline(backend: HFBackend, max_new_tokens: int) -> Pipeline:
    soc = SkipOneChar(distinct=False)  # what the run's cache was begun with
    config = ScoringConfig(intervention=soc.describe(), n_variants=L, top_k=K,
                           distance="hellinger", values="logits", approximate=False, seed=0,
                           max_new_tokens=max_new_tokens)  # fmt: skip
    rule = Rule(Policy.of(0.0), config, backend.model_id, on_error="flag")
    return Pipeline(backend=backend, intervention=soc, rule=rule)


def templated(example: Example, template: str = RAG_TEMPLATE) -> GuardedPrompt:
    """The prompt as ``guard.with_prompt(PromptTemplate(template))`` renders it."""
    prompt = TemplatedPrompt(prompt=PromptTemplate.from_template(template))
    value = prompt.render({"context": example.context, "question": example.question})
    return value.guarded  # type: ignore[no-any-return]


def without_passage(example: Example, template: str = RAG_TEMPLATE) -> list[ChatMessage]:
    """The prompt with its passage emptied: the one row context reliance is measured on."""
    prompt = PromptTemplate.from_template(template)
    return list(chat_messages(prompt.format_prompt(context="", question=example.question)))


def _score_batch(
    pipeline: Pipeline, backend: HFBackend, chunk: list[tuple[int, Example]], similarity: Any
) -> list[dict[str, Any]]:
    """Every method on one batch; one record per question."""
    clock = Clock()
    prompts = [templated(e) for _, e in chunk]
    items = [Item(p, index=i) for (i, _), p in zip(chunk, prompts, strict=True)]
    with clock.stage("generate"):
        gens = pipeline.do(Work("generate", items))
    pipeline.generated(items, gens)
    # ESI, question only (the context row is timed on its own below).
    _esi(pipeline, clock, items, "q")
    # ESI over the whole human message, as a plain `prompt | guard` does.
    whole = [Item(GuardedPrompt(b.prompt.messages, b.prompt.question_index), index=b.index)
             for b in items]  # fmt: skip
    for w, b in zip(whole, items, strict=True):
        w.answer, w.answer_ids, w.original, w.outcome = b.answer, b.answer_ids, b.original, None
        if not b.answer_ids:
            w.outcome = b.outcome
    _esi(pipeline, clock, whole, "w")
    # Context reliance: one row per answer, the passage emptied.
    scorable = [(b, e) for b, (_, e) in zip(items, chunk, strict=True) if b.answer_ids]
    requests = [ForcingRequest(prompt=list(b.prompt.messages), variants=[without_passage(e)],
                               answer_ids=list(b.answer_ids), answer=b.answer)
                for b, e in scorable]  # fmt: skip
    with clock.stage("force context"):
        forced = backend.teacher_force(requests, top_k=K)
    reliance = {}
    for (b, _), out in zip(scorable, forced, strict=True):
        assert b.original is not None and not isinstance(out, Exception)
        reliance[b.index] = esi_score(b.original, out.variants).score
    with clock.stage("sample"):
        samples = sample(backend, [p.messages for p in prompts], n=N_SAMPLES,
                         temperature=TEMPERATURE,
                         max_new_tokens=pipeline.config.max_new_tokens)  # fmt: skip
    records = []
    n = len(chunk)
    for (index, example), b, w, per in zip(chunk, items, whole, samples, strict=True):
        assert not isinstance(per, Exception)
        record: dict[str, Any] = {
            "index": index, "question": example.question, "answerable": example.answerable,
            "answers": list(example.answers), "answer": b.answer,
            "finish_reason": b.finish_reason, "scores": {},
        }  # fmt: skip
        q, wm = b.outcome, w.outcome
        if isinstance(q, ESIResult) and q.scored and isinstance(wm, ESIResult) and wm.scored:
            usable: list[Sample] = [s for s in per if s.token_logprobs] or per
            gen = b.steps["generate"]
            record["scores"] = {
                ESI_Q: q.score, ESI_W: wm.score, RELIANCE: 1 - reliance[index],
                "NLL (greedy)": neg_log_likelihood(token_logprobs(gen)),
                "mean token entropy": mean_token_entropy(gen.topk.values),
                "LN-PE": ln_pe(usable),
                "lexical similarity (ROUGE-L)": lexical_similarity(usable),
                "semantic entropy": semantic_entropy(usable, similarity, SE_THRESHOLD),
                "SAR (sentence)": sentence_sar(usable, similarity),
            }  # fmt: skip
        record["seconds"] = {stage: s / n for stage, s in clock.seconds.items()}
        records.append(record)
    return records


def _esi(pipeline: Pipeline, clock: Clock, items: list[Item], tag: str) -> None:
    """Intervene on and force the undecided items, timed as ``intervene/force <tag>``."""
    todo = [item for item in items if item.outcome is None]
    with clock.stage(f"intervene {tag}"):
        pipeline.intervened(todo, pipeline.do(Work("intervene", todo)))
    with clock.stage(f"force {tag}"):
        planned = pipeline.planned(todo, include_original=False)
        requests = [request for _, request in planned]
        pipeline.assessed(todo, planned, pipeline.do(Work("score", todo, requests)))


def run_rag(
    backend: HFBackend,
    path: Path,
    *,
    limit: int,
    max_new_tokens: int,
    batch: int,
    semantic: Semantic,
    cache_dir: Path,
    shard: tuple[int, int],
) -> list[dict[str, Any]]:
    """Score this shard's questions (resuming from its cache); the report of every shard."""
    examples = load_examples(path, limit=limit, seed=0)
    k, n = shard
    header = {"data": str(path), "limit": limit, "model": backend.model_id,
              "max_new_tokens": max_new_tokens, "template": RAG_TEMPLATE}  # fmt: skip
    cache = Cache(cache_dir, path.parent.name, header)
    done = cache.done()
    todo = [(i, e) for i, e in enumerate(examples) if i % n == k and i not in done]
    pipeline = _pipeline(backend, max_new_tokens)
    similarity = semantic.similarity
    cache.fill(shard, todo, batch,
               lambda chunk: _score_batch(pipeline, backend, list(chunk), similarity))  # fmt: skip
    return report(cache)


def report(cache: Cache) -> list[dict[str, Any]]:
    """Records (``run.py``'s fields plus intervals) from every shard's cache."""
    rows = cache.done()
    dataset = cache.name
    ordered = [rows[i] for i in sorted(rows)]
    scored = [r for r in ordered if r["scores"]]
    labels = Declines().label([r["question"] for r in ordered], [r["answer"] for r in ordered],
                              [r["answers"] for r in ordered])  # fmt: skip
    right = {r["index"]: ok for r, ok in zip(ordered, labels, strict=True)}
    wrong = np.array([int(not right[r["index"]]) for r in scored])
    unanswerable = np.array([int(not r["answerable"]) for r in scored])
    methods = list(scored[0]["scores"]) if scored else []
    values = {m: np.array([r["scores"][m] for r in scored]) for m in methods}
    seconds: dict[str, float] = defaultdict(float)
    for r in ordered:
        for stage, s in r["seconds"].items():
            seconds[stage] += s / len(ordered)
    sampled = seconds["generate"] + seconds["sample"]
    plain = seconds["generate"]
    cost = {ESI_Q: plain + seconds["intervene q"] + seconds["force q"],
            ESI_W: plain + seconds["intervene w"] + seconds["force w"],
            RELIANCE: plain + seconds["force context"],
            "NLL (greedy)": plain, "mean token entropy": plain}  # fmt: skip
    answerable = [r for r in ordered if r["answerable"]]
    impossible = [r for r in ordered if not r["answerable"]]

    def share(rows: list[dict[str, Any]], test: Any) -> float:
        return sum(bool(test(r)) for r in rows) / max(len(rows), 1)

    summary = {
        "n_questions": len(ordered), "n_scored": len(scored),
        "accuracy_answerable": share(answerable, lambda r: right[r["index"]]),
        "accuracy_unanswerable": share(impossible, lambda r: right[r["index"]]),
        "declined_answerable": share(answerable, lambda r: declined(r["answer"])),
        "n_answerable": len(answerable), "n_unanswerable": len(impossible),
    }  # fmt: skip
    records = []
    for target, labels_ in (("wrong", wrong), ("unanswerable", unanswerable)):
        for method in methods:
            estimate = bootstrap(auroc, values[method], labels_, n_resamples=2000)
            records.append({
                "dataset": dataset, "method": method, "target": target,
                "auroc": estimate.value, "auroc_low": estimate.low, "auroc_high": estimate.high,
                "seconds_per_example": cost.get(method, sampled), "n": len(scored),
                "accuracy": 1 - float(wrong.mean()), "labels": "declines+containment",
                "note": "" if method != RELIANCE else "ranked as 1 - reliance", **summary,
            })  # fmt: skip
        best = max(FREE, key=lambda m: auroc(values[m], labels_))
        for method in (ESI_Q, RELIANCE):
            diff = paired_difference(auroc, values[method], values[best], labels_, n_resamples=2000)
            records.append({
                "dataset": dataset, "method": f"{method} - {best}", "target": target,
                "auroc_difference": diff.value, "low": diff.low, "high": diff.high,
                "n": len(scored), "paired": True,
            })  # fmt: skip
        diff = paired_difference(auroc, values[ESI_Q], values[ESI_W], labels_, n_resamples=2000)
        records.append({"dataset": dataset, "method": f"{ESI_Q} - {ESI_W}", "target": target,
                        "auroc_difference": diff.value, "low": diff.low, "high": diff.high,
                        "n": len(scored), "paired": True})  # fmt: skip
    records.append({"dataset": dataset, "method": "plain greedy answer", "target": "wrong",
                    "auroc": None, "seconds_per_example": seconds["generate"],
                    "n": len(ordered), "note": "no guard", **summary})  # fmt: skip
    return records


def markdown(records: list[dict[str, Any]]) -> str:
    """The RAG records as a table: AUROC [95% CI] per target, paired differences, seconds."""
    rows = [
        r for r in records if r.get("target") and not r.get("paired") and r["auroc"] is not None
    ]
    if not rows:
        return ""
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["target"]): r for r in rows}
    lines = ["| method | wrong vs right AUROC [95% CI] | unanswerable vs answerable AUROC "
             "[95% CI] | s/question |", "|---|---|---|---|"]  # fmt: skip
    for m in methods:
        wrong, unanswerable = (cell[(m, "wrong")], cell[(m, "unanswerable")])
        parts = [f"{r['auroc']:.3f} [{r['auroc_low']:.3f}, {r['auroc_high']:.3f}]"
                 for r in (wrong, unanswerable)]  # fmt: skip
        lines.append(f"| {m} | {parts[0]} | {parts[1]} | {wrong['seconds_per_example']:.2f} |")
    lines.append("")
    for r in records:
        if r.get("paired"):
            lines.append(f"- {r['target']}: {r['method']} = {r['auroc_difference']:+.3f} "
                         f"[{r['low']:+.3f}, {r['high']:+.3f}] (paired, n={r['n']})")  # fmt: skip
    s = rows[0]
    lines.append(
        f"- n={s['n_questions']} ({s['n_answerable']} answerable, {s['n_unanswerable']} "
        f"unanswerable), {s['n_scored']} scored; accuracy answerable "
        f"{s['accuracy_answerable']:.3f}, unanswerable {s['accuracy_unanswerable']:.3f} "
        "(declined); answerable declined "
        f"{s['declined_answerable']:.3f}"
    )
    return "\n".join(lines)
