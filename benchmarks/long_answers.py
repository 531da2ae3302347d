r"""Long answers with a label per sentence: does the sentence score find the wrong sentences?

    python -m benchmarks.long_answers --data ../shared/data/sciq/test.jsonl --limit 400 \\
        --cache .bench-cache --resume          # closed-book, then controlled
    python -m benchmarks.long_answers --data ../shared/data/squad2/dev.json --limit 400 \\
        --cache .bench-cache --resume          # RAG
    python -m benchmarks.long_answers --report --data ... --cache .bench-cache   # table only
    python -m benchmarks.long_answers --model <a .gguf> ...    # another model: its own cache

(As a file it imports ``benchmarks`` from the installed checkout, ``pip install -e .``.)

Three forms (``--form``; by default RAG for SQuAD 2.0 data, else closed-book and controlled),
each prompt ``k`` questions (``--questions-per-prompt``, 3) built by
:mod:`esi_guard.calibration.long_answers`:

* ``closed-book``: one prompt asks the ``k`` questions, numbered, for one sentence each;
  the guard answers and scores it (``ESIGuard.assess``, the prompt rendered as
  ``with_prompt`` renders it, so only the numbered questions are intervened on);
* ``controlled``: each question asked alone (one sentence, greedy), the ``k`` answers
  joined, numbered, into one answer and scored under the ``k``-question prompt
  (``ESIGuard.score``): alignment is known by construction, so no sentence depends on
  the model following the format;
* ``rag``: one SQuAD 2.0 passage and ``k`` of its questions (some unanswerable: a right
  sentence for one is a decline).

Each sentence of ``ESIResult.sentences`` is aligned to its question and labelled (right,
wrong, or unaligned: counted and left out). The report, per form: AUROC for wrong
sentences of the sentence's ESI, of the whole answer's ESI given to each of its
sentences, and of the sentence's free signals (NLL, mean entropy, max token NLL), with 95%
intervals from a bootstrap over prompts, and the paired difference sentence - whole; then,
keeping 80% of the right sentences (a threshold fitted on four fifths of the prompts and
applied to the fifth, over 5 folds), the share of wrong sentences removed by redacting
sentences vs by withholding whole answers.

One JSONL record per prompt goes to ``--cache`` as soon as its batch is done
(:mod:`benchmarks.cache`), each sentence with ``text``, ``start``, ``end``, ``question``,
``how``, ``label``, ``score``, ``whole_score``, ``entropy``, ``max_nll``, ``nll``; a run
continues a cache with ``--resume`` (and a larger ``--limit`` extends it).
"""

from __future__ import annotations

import argparse
import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.prompts import ChatPromptTemplate

from benchmarks.cache import Cache
from benchmarks.shared_data import shared_data
from esi_guard import ESIGuard, ESIResult, LlamaCppBackend
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.long_answers import (
    ONE_QUESTION_SYSTEM,
    LongPrompt,
    SentenceLabel,
    clustered,
    group_closed_book,
    group_rag,
    joined_answer,
    label_sentences,
    removed_at_kept,
)
from esi_guard.calibration.metrics import Estimate, auroc
from esi_guard.guard import TemplatedPrompt, chat_messages
from esi_guard.sentences import split_sentences

FORMS = ("closed-book", "controlled", "rag")
SIGNALS = ("nll", "entropy", "max_nll")
KEPT, FOLDS = 0.8, 5
ONE_ANSWER_TOKENS = 64
"""The controlled form's answers to one question each (their first sentence is kept)."""
ITEM_SEP = "\n"
"""Between the controlled form's joined answers: one per line, as the model numbers them."""
THRESHOLD = 0.25
"""Nothing is decided on it (``action="flag"``); the shipped one was fitted on other settings."""


def prompts_of(path: Path, form: str, k: int, limit: int | None) -> list[LongPrompt]:
    """The form's prompts from a data file, its questions shuffled once (seed 0)."""
    examples = load_examples(path, seed=0)
    grouped = group_rag(examples, k) if form == "rag" else group_closed_book(examples, k)
    return grouped[:limit] if limit else grouped


def rendered(prompt: LongPrompt) -> Any:
    """The prompt as ``guard.with_prompt(..., question_key="questions")`` renders it."""
    template = ChatPromptTemplate.from_messages([("human", prompt.template)])
    return TemplatedPrompt(prompt=template, question_key="questions").render(prompt.variables())


def _one_at_a_time(guard: ESIGuard, prompts: Sequence[LongPrompt]) -> list[list[str]]:
    """Each question's greedy answer asked alone, its first sentence, per prompt.

    The prompt asks for one sentence; a small model often goes on, so only the first is
    kept: the joined answer then has one sentence per question, as the k-question prompt
    asks.
    """
    asked = [chat_messages([("system", ONE_QUESTION_SYSTEM), ("human", q)])
             for p in prompts for q in p.questions]  # fmt: skip
    gens = guard.backend.generate(asked, max_new_tokens=ONE_ANSWER_TOKENS, top_k=guard.top_k)
    texts = [_first_sentence(g.text) if not isinstance(g, Exception) else "" for g in gens]
    k = len(prompts[0].questions) if prompts else 0
    return [texts[i * k : (i + 1) * k] for i in range(len(prompts))]


def _first_sentence(text: str) -> str:
    spans = split_sentences(text.strip())
    return text.strip()[slice(*spans[0])].strip() if spans else ""


def score_batch(
    guard: ESIGuard, form: str, chunk: Sequence[tuple[int, LongPrompt]]
) -> list[dict[str, Any]]:
    """One record per prompt of ``chunk``: the answer, its score and its sentences."""
    prompts = [p for _, p in chunk]
    if form == "controlled":
        parts = _one_at_a_time(guard, prompts)
        joined = [joined_answer(answers, ITEM_SEP) for answers in parts]
        results: list[Any] = [guard.score(rendered(p), text)
                              for p, (text, _) in zip(prompts, joined, strict=True)]  # fmt: skip
        items: list[Any] = [spans for _, spans in joined]
    else:
        results = list(guard.assess([rendered(p) for p in prompts]))
        parts, items = [[] for _ in prompts], [None] * len(prompts)
    return [
        record(index, prompt, result, item_spans, answers)
        for (index, prompt), result, item_spans, answers in zip(
            chunk, results, items, parts, strict=True
        )
    ]


def record(
    index: int,
    prompt: LongPrompt,
    result: ESIResult | BaseException,
    items: list[tuple[int, int]] | None,
    parts: list[str],
) -> dict[str, Any]:
    """A prompt's record: its questions, the answer, and each sentence labelled."""
    base: dict[str, Any] = {
        "index": index, "questions": list(prompt.questions),
        "answers": [list(e.answers) for e in prompt.examples],
        "unanswerable": list(prompt.unanswerable),
    }  # fmt: skip
    if parts:
        base |= {"parts": parts, "items": items}
    if not isinstance(result, ESIResult) or not result.scored or not result.sentences:
        reason = result.reason if isinstance(result, ESIResult) else type(result).__name__
        answer = result.answer if isinstance(result, ESIResult) else None
        return {**base, "answer": answer, "score": None, "scored": False, "reason": reason,
                "sentences": []}  # fmt: skip
    sentences = [
        {"text": s.text, "start": s.start, "end": s.end, "score": s.score,
         "whole_score": result.score, **{name: s.signals.get(name) for name in SIGNALS}}
        for s in result.sentences
    ]  # fmt: skip
    return labelled({**base, "answer": result.answer, "score": result.score, "scored": True,
                     "reason": None, "sentences": sentences})  # fmt: skip


def labelled(rec: dict[str, Any]) -> dict[str, Any]:
    """The record with each sentence's ``question``, ``how`` and ``label`` (re)made.

    Labels: ``right``, ``wrong``, ``unaligned`` (no question found), ``question`` (the
    sentence asks: an echoed question). The report relabels the cache's records, so a
    cache outlives a refinement of the labels.
    """
    examples = tuple(Example(q, tuple(a)) for q, a in zip(rec["questions"], rec["answers"],
                                                         strict=True))  # fmt: skip
    prompt = LongPrompt(examples, "{questions}")
    spans = [(s["start"], s["end"]) for s in rec["sentences"]]
    items = [tuple(span) for span in rec["items"]] if rec.get("items") else None
    labels = label_sentences(prompt, rec["answer"] or "", spans, items)
    sentences = [{**s, "question": lab.question, "how": lab.how, "label": _label(lab)}
                 for s, lab in zip(rec["sentences"], labels, strict=True)]  # fmt: skip
    return {**rec, "sentences": sentences}


def _label(label: SentenceLabel) -> str:
    if label.asks:
        return "question"
    return "unaligned" if label.right is None else "right" if label.right else "wrong"


def run(
    guard: ESIGuard,
    prompts: Sequence[LongPrompt],
    form: str,
    cache: Cache,
    *,
    batch: int = 4,
) -> dict[int, dict[str, Any]]:
    """Score the prompts the cache lacks, in batches; every record of the cache."""
    done = cache.done()
    todo = [(i, p) for i, p in enumerate(prompts) if i not in done]
    cache.fill((0, 1), todo, batch, lambda chunk: score_batch(guard, form, chunk))
    return cache.done()


def sentence_rows(records: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The aligned, scored sentences of every record, each with its prompt's index."""
    rows = []
    for index, rec in sorted(records.items()):
        for s in rec["sentences"]:
            values = [s["score"], s["whole_score"], *(s[name] for name in SIGNALS)]
            if s["label"] in ("right", "wrong") and all(_finite(v) for v in values):
                rows.append({**s, "prompt": index})
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def report(records: dict[int, dict[str, Any]], *, n_resamples: int = 1000) -> dict[str, Any]:
    """The form's figures: counts, AUROCs, the paired difference, removal at 80% kept."""
    records = {i: labelled(r) for i, r in records.items()}
    labels = Counter(s["label"] for r in records.values() for s in r["sentences"])
    how = Counter(str(s["how"]) for r in records.values() for s in r["sentences"])
    out: dict[str, Any] = {
        "prompts": len(records), "unscored": sum(not r["scored"] for r in records.values()),
        "right": labels["right"], "wrong": labels["wrong"], "unaligned": labels["unaligned"],
        "questions": labels["question"],
        "aligned_by": dict(how),
    }  # fmt: skip
    rows = sentence_rows(records)
    wrong = np.array([int(r["label"] == "wrong") for r in rows])
    if len(set(wrong.tolist())) < 2:
        return out
    prompt = np.array([r["prompt"] for r in rows])
    columns = {"sentence ESI": "score", "whole-answer ESI": "whole_score"} | {
        f"sentence {name}": name for name in SIGNALS
    }
    values = {name: np.array([r[key] for r in rows], dtype=np.float64)
              for name, key in columns.items()}  # fmt: skip

    def interval(statistic: Callable[[np.ndarray], float]) -> Estimate:
        return clustered(statistic, prompt, n_resamples=n_resamples)

    def ranked_by(v: np.ndarray) -> Callable[[np.ndarray], float]:
        return lambda p: auroc(v[p], wrong[p])

    out["auroc"] = {name: interval(ranked_by(v)) for name, v in values.items()}
    sent, whole = values["sentence ESI"], values["whole-answer ESI"]
    out["sentence - whole"] = interval(
        lambda p: auroc(sent[p], wrong[p]) - auroc(whole[p], wrong[p])
    )
    folds = prompt % FOLDS
    if all((~(folds == f) & (wrong == 0)).any() for f in range(FOLDS)):
        out["removal"] = removal(sent, whole, wrong, folds, interval)
    return out


def removal(
    sent: np.ndarray,
    whole: np.ndarray,
    wrong: np.ndarray,
    folds: np.ndarray,
    interval: Callable[[Callable[[np.ndarray], float]], Estimate],
) -> dict[str, Estimate]:
    """Shares of wrong removed and of right kept, redacting vs withholding, at 80% kept."""
    by_sentence = removed_at_kept(sent, wrong, folds, KEPT)
    by_answer = removed_at_kept(whole, wrong, folds, KEPT)
    is_wrong = wrong == 1

    def share(removed: np.ndarray, among: np.ndarray, p: np.ndarray) -> float:
        picked = among[p]
        return float(removed[p][picked].mean()) if picked.any() else math.nan

    def ratio(p: np.ndarray) -> float:
        withheld = share(by_answer, is_wrong, p)
        return share(by_sentence, is_wrong, p) / withheld if withheld > 0 else math.nan

    return {
        "redaction: wrong removed": interval(lambda p: share(by_sentence, is_wrong, p)),
        "withholding: wrong removed": interval(lambda p: share(by_answer, is_wrong, p)),
        "redaction: right kept": interval(lambda p: 1 - share(by_sentence, ~is_wrong, p)),
        "withholding: right kept": interval(lambda p: 1 - share(by_answer, ~is_wrong, p)),
        "redaction / withholding": interval(ratio),
    }


def table(form: str, figures: dict[str, Any]) -> str:
    """The form's figures as Markdown."""
    head = (
        f"### {form}: {figures['prompts']} prompts ({figures['unscored']} unscored), "
        f"{figures['right'] + figures['wrong']} aligned sentences ({figures['right']} right, "
        f"{figures['wrong']} wrong); left out: {figures['unaligned']} unaligned, "
        f"{figures['questions']} asking (echoed questions)\n\n"
        f"aligned by: {', '.join(f'{k} {v}' for k, v in sorted(figures['aligned_by'].items()))}"
    )
    if "auroc" not in figures:
        return head + "\n\n(one class only: no AUROC)"
    lines = [head, "", "| score | AUROC for wrong sentences [95% CI] |", "|---|---|"]
    lines += [f"| {name} | {value} |" for name, value in figures["auroc"].items()]
    diff = figures["sentence - whole"]
    verdict = "tie" if diff.low <= 0 <= diff.high else ("win" if diff.low > 0 else "loss")
    lines.append(f"| sentence - whole (paired) | {diff} {verdict} |")
    if "removal" in figures:
        lines += ["", f"| at {KEPT:.0%} of right sentences kept | share [95% CI] |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in figures["removal"].items()]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Long answers with a label per sentence")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="a shared QA set (default: sciq/test.jsonl; squad2/dev.json for rag)",
    )
    parser.add_argument("--limit", type=int, default=None, help="prompts per form")
    parser.add_argument("--questions-per-prompt", "-k", type=int, default=3, dest="k")
    parser.add_argument(
        "--form",
        choices=[*FORMS, "auto", "all"],
        default="auto",
        help="auto: rag for SQuAD 2.0 data, else closed-book and controlled",
    )
    parser.add_argument("--cache", type=Path, default=Path(".bench-cache"))
    parser.add_argument("--resume", action="store_true", help="continue the cache's records")
    parser.add_argument("--report", action="store_true", help="only report the cache")
    parser.add_argument(
        "--model", default="default", help="'default' (the embedded model) or a GGUF file's path"
    )
    parser.add_argument("--n-threads", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--n-resamples", type=int, default=1000)
    return parser  # fmt: skip


def _slug(stem: str) -> str:
    """A file-name part: ``qwen2-5-coder-1-5b-instruct-q4-k-m`` for the 1.5B GGUF."""
    return re.sub(r"[^a-z0-9]+", "-", stem.lower()).strip("-")


def _forms(form: str, data: Path | None) -> list[tuple[str, Path]]:
    base = shared_data()
    books, squad = base / "sciq" / "test.jsonl", base / "squad2" / "dev.json"
    if form == "all":
        return [("closed-book", data or books), ("controlled", data or books), ("rag", squad)]
    if form == "auto":
        path = data or books
        rag = path.suffix == ".json"
        return [("rag", path)] if rag else [("closed-book", path), ("controlled", path)]
    return [(form, data or (squad if form == "rag" else books))]


def main(argv: Sequence[str] | None = None, guard: ESIGuard | None = None) -> dict[str, Any]:
    """Run (or with ``--report`` only read) each form and print its table; the figures."""
    args = _parser().parse_args(argv)
    if guard is None:
        backend = (
            LlamaCppBackend.default(n_threads=args.n_threads)
            if args.model == "default"
            else LlamaCppBackend.from_path(args.model, n_threads=args.n_threads)
        )
        guard = ESIGuard(backend=backend, max_new_tokens=args.max_new_tokens, threshold=THRESHOLD)
    # The embedded model's runs keep their names; another model's carry its file's stem.
    model = "" if args.model == "default" else "-" + _slug(Path(args.model).stem)
    out = {}
    for form, path in _forms(args.form, args.data):
        prompts = prompts_of(path, form, args.k, args.limit)
        header = {"data": str(path.resolve()), "form": form, "k": args.k,
                  "model": guard.backend.model_id, "max_new_tokens": guard.max_new_tokens,
                  "n_variants": guard.n_variants, "top_k": guard.top_k,
                  "template": prompts[0].template if prompts else None}  # fmt: skip
        cache = Cache(args.cache, f"long_answers-{form}-{path.parent.name}{model}", header)
        if not args.report:
            if cache.done() and not args.resume:
                msg = f"{cache.path((0, 1))} holds records: pass --resume to continue it"
                raise SystemExit(msg)
            run(guard, prompts, form, cache, batch=args.batch)
        records = {i: r for i, r in cache.done().items() if not args.limit or i < args.limit}
        out[form] = report(records, n_resamples=args.n_resamples)
        print(table(form, out[form]), end="\n\n", flush=True)
    return out


if __name__ == "__main__":
    main()
