"""The closed-book half of ``benchmarks.results.run``: every method on the QA sets without passages.

Each question's scores, per-variant ESI scores and stage times go to a JSONL cache
(:mod:`benchmarks.cache`, ``<dataset>-closed-<k>of<n>.jsonl``) as soon as its batch is done,
so a data set resumes after an interruption and can be split over processes (``--shard``).
The cache does not depend on ``--limit``: the questions are shuffled once (seed 0) and a
larger limit only adds questions. Once every question of the limit is scored, the report
is made from the caches.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.baselines import (
    PTRUE_PROMPT,
    lexical_similarity,
    ln_pe,
    mean_token_entropy,
    neg_log_likelihood,
    p_true,
    sar,
    semantic_entropy,
    sentence_sar,
)
from benchmarks.cache import Cache
from benchmarks.common import Answering, Clock, token_entropies, token_logprobs
from benchmarks.nli import NLIModel
from esi_guard import ConfigurationError, FixedVariants, HFBackend, SkipOneChar, esi_score
from esi_guard.backends import ChatMessage, ForcingRequest, Generation
from esi_guard.backends.sampling import SAMPLERS, Sample, sample
from esi_guard.calibration.combined_fit import fit_combined
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.labels import Containment, Labeller, Semantic
from esi_guard.calibration.metrics import (
    auroc,
    bootstrap,
    expected_calibration_error,
    paired_difference,
)

__all__ = ["run_closed"]

L_MAX, K_MAX = 10, 100
LS, KS = (2, 3, 5), (5, 20)
DISTANCES = ("squared_hellinger", "kl", "bhattacharyya")
N_SAMPLES, TEMPERATURE = 10, 1.0
SE_THRESHOLD = 0.8
EMBEDDINGS = "all-MiniLM-L6-v2 cosine"
ESI = "ESI(SOC) L=10"
COMBINED = "combined P(wrong)"
SUPPORT_ALL = "ESI(SOC) support=all"
FIDELITY = {
    "ESI(SOC) repeats allowed": SkipOneChar(distinct=False),
    "ESI(SOC) exact words": SkipOneChar(words="exact"),
}
"""SOC as the paper's text reads (independent draws: repeats and unchanged copies
count, scoring 0) and as the authors' code edits (ceil(p*n) words), beside the default
(draws that differ from the question and from each other)."""
NOTES = {
    "semantic entropy": f"equivalence: {EMBEDDINGS} >= {SE_THRESHOLD} both ways "
    "(paper: DeBERTa-MNLI)",
    "SAR (sentence)": f"relevance: {EMBEDDINGS} (paper: RoBERTa cross-encoder); sentence "
    "level only",
    "SAR": f"token and sentence relevance: {EMBEDDINGS} (paper: RoBERTa cross-encoder)",
    "ESI(Para) L=10": "precomputed paraphrases (paraphrase.jsonl), SOC top-up",
    "ESI(Para) L=5": "the paper's L for Para: the first 5 of the L=10 pass (time: half)",
    SUPPORT_ALL: "union over all the answer's distributions (the authors' code)",
    "ESI(SOC) repeats allowed": "independent draws, as the paper's text (0.1.0's default)",
    "ESI(SOC) exact words": "ceil(p*n) eligible words edited, as the authors' code",
    "ESI(SOC) kl": "KL(original || variant), the paper's direction",
}


@dataclass(frozen=True)
class Judges:
    """What decides meaning for the semantic baselines: embeddings, or a local NLI model."""

    similarity: Any
    """The packaged MiniLM's cosine similarity (texts -> n x n)."""
    nli: NLIModel | None = None
    """``--nli MODEL``: entailment both ways clusters semantic entropy, and its scores are
    SAR's relevance (the papers' choice); None keeps the embeddings."""

    def semantic_entropy(self, samples: list[Sample]) -> float:
        if self.nli is None:
            return semantic_entropy(samples, self.similarity, SE_THRESHOLD)
        return semantic_entropy(samples, self.nli.equivalence, 0.5)

    @property
    def relevance(self) -> Any:
        return self.similarity if self.nli is None else self.nli.relevance

    @property
    def pairs(self) -> Any:
        return None if self.nli is None else self.nli.pair_scores

    def describe(self) -> str | None:
        return None if self.nli is None else self.nli.name


@dataclass(frozen=True)
class Parts:
    """How many leading questions (of the shuffled set) get the costly parts of the run.

    ESI and the free signals run on every question; the sampling baselines and P(True)
    on the first ``sampling``, the L=2/3/5 passes timed on their own on the first
    ``ablation`` (beyond it their scores come from the first variants of the L=10 pass),
    and the fidelity passes (``FIDELITY``: SOC as the paper's text and as the authors' code)
    on the first ``fidelity``. None: all.
    """

    sampling: int | None = None
    ablation: int | None = None
    fidelity: int | None = None

    def needs(self, index: int) -> dict[str, bool]:
        """The parts question ``index`` gets."""
        return {part: limit is None or index < limit for part, limit in (
            ("sampling", self.sampling), ("ablation", self.ablation),
            ("fidelity", self.fidelity))}  # fmt: skip

    def covered(self, record: dict[str, Any]) -> bool:
        """Whether a cached record has every part its question needs now."""
        had = _had(record)
        return all(had[part] or not need for part, need in self.needs(record["index"]).items())


def force(
    backend: HFBackend,
    examples: list[Example],
    gens: list[Generation],
    variants: list[list[str]],
    answering: Answering,
    include_original: bool = False,
) -> list[Any]:
    """Teacher-force each greedy answer after its question's variants (and itself)."""
    ask = answering.messages
    requests = [
        ForcingRequest(prompt=ask(e.question), variants=[ask(v) for v in vs],
                       answer_ids=g.token_ids, answer=g.text,
                       include_original=include_original)
        for e, g, vs in zip(examples, gens, variants, strict=True)
    ]  # fmt: skip
    return list(backend.teacher_force(requests, top_k=K_MAX))


def _force_some(
    backend: HFBackend,
    examples: list[Example],
    gens: list[Generation],
    variants: list[list[str]],
    answering: Answering,
    include_original: bool = False,
) -> list[Any]:
    """:func:`force` for the questions with a variant; None for the others.

    SOC has no variant of a question without a long enough word: the guard does not
    score it either.
    """
    some = [i for i, (e, vs) in enumerate(zip(examples, variants, strict=True))
            if any(v != e.question for v in vs)]  # fmt: skip
    out: list[Any] = [None] * len(examples)
    if some:
        forced = force(backend, [examples[i] for i in some], [gens[i] for i in some],
                       [variants[i] for i in some], answering, include_original)  # fmt: skip
        for i, f in zip(some, forced, strict=True):
            out[i] = f
    return out


def p_true_scores(backend: HFBackend, examples: list[Example], answers: list[str]) -> list[float]:
    """1 - P(True) of the model judging its own greedy answer (next token: A or B)."""
    prompts = [
        [ChatMessage(role="user", content=PTRUE_PROMPT.format(question=e.question, answer=a))]
        for e, a in zip(examples, answers, strict=True)
    ]
    vocab = len(backend.tokenizer)
    outs = backend.generate(prompts, max_new_tokens=1, top_k=vocab)
    option_a = backend.encode_answer(prompts[0], "A")[0]
    option_b = backend.encode_answer(prompts[0], "B")[0]
    scores = []
    for out in outs:
        assert isinstance(out, Generation)
        row = dict(zip(out.topk.ids[0].tolist(), out.topk.values[0].tolist(), strict=True))
        scores.append(p_true(row[option_a], row[option_b]))
    return scores


def score_batch(
    backend: HFBackend,
    chunk: list[tuple[int, Example]],
    *,
    para: FixedVariants | None,
    judges: Judges,
    answering: Answering,
    parts: Parts,
) -> list[dict[str, Any]]:
    """Every method on one batch; one record per question (``scores`` empty: no answer)."""
    clock = Clock()
    examples = [e for _, e in chunk]
    with clock.stage("generate"):
        out = backend.generate([answering.messages(e.question) for e in examples],
                               max_new_tokens=answering.max_new_tokens, top_k=K_MAX,
                               stop=answering.stop)  # fmt: skip
    records: list[dict[str, Any]] = [
        {"index": i, "question": e.question,
         "answer": g.text if isinstance(g, Generation) else "", "scores": {}, "variants": {}}
        for (i, e), g in zip(chunk, out, strict=True)
    ]  # fmt: skip
    for record in records:
        record["seconds"] = {"generate": clock.seconds["generate"] / len(chunk)}
        record["parts"] = parts.needs(record["index"])
    groups: dict[tuple[bool, ...], list[Any]] = defaultdict(list)
    for r, e, g in zip(records, examples, out, strict=True):
        if isinstance(g, Generation) and g.token_ids:
            needs = r["parts"]
            groups[needs["ablation"], needs["sampling"], needs["fidelity"]].append((r, e, g))
    for (ablation, sampling, fidelity), kept in groups.items():
        seconds = _score(backend, kept, para=para, judges=judges, answering=answering,
                         ablation=ablation, sampling=sampling, fidelity=fidelity)  # fmt: skip
        for r, _, _ in kept:
            r["seconds"] |= {stage: s / len(kept) for stage, s in seconds.items()}
    return records


def _score(
    backend: HFBackend,
    kept: list[tuple[dict[str, Any], Example, Generation]],
    *,
    para: FixedVariants | None,
    judges: Judges,
    answering: Answering,
    ablation: bool,
    sampling: bool,
    fidelity: bool = True,
) -> dict[str, float]:
    """Every method on answers already generated; the seconds of each stage."""
    clock = Clock()
    records, examples, gens = (list(x) for x in zip(*kept, strict=True))
    socs = [SkipOneChar().variants(e.question, L_MAX, seed=0) for e in examples]
    for n_variants in (*LS, L_MAX) if ablation else (L_MAX,):
        with clock.stage(f"force L={n_variants}"):
            forced = _force_some(backend, examples, gens, [v[:n_variants] for v in socs],
                                 answering)  # fmt: skip
        for r, g, f in zip(records, gens, forced, strict=True):
            if f is not None:
                r["scores"][f"ESI(SOC) L={n_variants}"] = esi_score(g.topk, f.variants).score
    for r, g, f in zip(records, gens, forced, strict=True):  # the L=10 pass
        r["scores"]["NLL (greedy)"] = neg_log_likelihood(token_logprobs(g))
        r["scores"]["mean token entropy"] = mean_token_entropy(g.topk.values)
        r["tokens"] = {"logprob": token_logprobs(g), "entropy": token_entropies(g)}
        if f is None:
            continue
        if not ablation:  # the first L of the same variants, forced in the L=10 pass
            for n_variants in LS:
                esi = esi_score(g.topk, f.variants[:n_variants])
                r["scores"][f"ESI(SOC) L={n_variants}"] = esi.score
        r["variants"]["ESI(SOC)"] = list(esi_score(g.topk, f.variants).variant_scores)
        for k in KS:
            heads = [v.head(k) for v in f.variants]
            r["scores"][f"ESI(SOC) k={k}"] = esi_score(g.topk.head(k), heads).score
        for distance in DISTANCES:
            esi = esi_score(g.topk, f.variants, distance=distance)  # type: ignore[arg-type]
            r["scores"][f"ESI(SOC) {distance}"] = esi.score
        r["scores"][SUPPORT_ALL] = esi_score(g.topk, f.variants, support="all").score
    for name, soc in FIDELITY.items() if fidelity else ():  # own passes
        with clock.stage(f"force {name}"):
            variants = [soc.variants(e.question, L_MAX, seed=0) for e in examples]
            forced = _force_some(backend, examples, gens, variants, answering)
        for r, g, f in zip(records, gens, forced, strict=True):
            if f is not None:
                r["scores"][name] = esi_score(g.topk, f.variants).score
    if para is not None:
        with clock.stage("force para"):
            paras = [para.variants(e.question, L_MAX, seed=0) for e in examples]
            forced = force(backend, examples, gens, paras, answering)
        for r, g, f in zip(records, gens, forced, strict=True):
            esi = esi_score(g.topk, f.variants)
            r["scores"]["ESI(Para) L=10"] = esi.score
            r["scores"]["ESI(Para) L=5"] = esi_score(g.topk, f.variants[:5]).score
            r["variants"]["ESI(Para)"] = list(esi.variant_scores)
    if sampling:
        answers = [g.text for g in gens]
        _sampling(backend, clock, records, examples, answers, judges, answering)
    return dict(clock.seconds)


def top_up(
    backend: HFBackend,
    chunk: list[tuple[dict[str, Any], Example]],
    *,
    judges: Judges,
    answering: Answering,
) -> list[dict[str, Any]]:
    """The sampling baselines and P(True) for questions cached without them.

    Each record comes back whole, its ESI scores and times kept (the cache keeps the newer
    one): a larger ``--sampling-limit`` costs only the sampling.
    """
    clock = Clock()
    records = [
        {**r, "scores": dict(r["scores"]), "seconds": dict(r["seconds"]),
         "parts": {**r["parts"], "sampling": True}}
        for r, _ in chunk
    ]  # fmt: skip
    kept = [(r, e) for r, (_, e) in zip(records, chunk, strict=True) if r["scores"]]
    if kept:
        _sampling(backend, clock, [r for r, _ in kept], [e for _, e in kept],
                  [r["answer"] for r, _ in kept], judges, answering)  # fmt: skip
        for r, _ in kept:
            r["seconds"] |= {stage: s / len(kept) for stage, s in clock.seconds.items()}
    return records


def _sampling(
    backend: HFBackend,
    clock: Clock,
    records: list[dict[str, Any]],
    examples: list[Example],
    answers: list[str],
    judges: Judges,
    answering: Answering,
) -> None:
    """The sampling baselines and P(True)."""
    with clock.stage("sample"):
        samples = sample(
            backend,
            [answering.messages(e.question) for e in examples], n=N_SAMPLES,
            temperature=TEMPERATURE, max_new_tokens=answering.max_new_tokens, stop=answering.stop,
        )  # fmt: skip
    for r, per in zip(records, samples, strict=True):
        assert not isinstance(per, Exception)
        usable: list[Sample] = [s for s in per if s.token_logprobs] or per
        r["scores"]["LN-PE"] = ln_pe(usable)
        with clock.stage("rouge"):
            r["scores"]["lexical similarity (ROUGE-L)"] = lexical_similarity(usable)
        with clock.stage("judge semantic entropy"):
            r["scores"]["semantic entropy"] = judges.semantic_entropy(usable)
        with clock.stage("judge SAR (sentence)"):
            r["scores"]["SAR (sentence)"] = sentence_sar(usable, judges.relevance)
        with clock.stage("judge SAR"):
            r["scores"]["SAR"] = sar(usable, judges.relevance, pairs=judges.pairs)
    with clock.stage("p_true"):
        for r, value in zip(records, p_true_scores(backend, examples, answers), strict=True):
            r["scores"]["P(True)"] = value


def run_closed(
    backend: HFBackend,
    path: Path,
    *,
    limit: int,
    batch: int,
    semantic: Semantic,
    cache_dir: Path,
    shard: tuple[int, int],
    answering: Answering | None = None,
    parts: Parts | None = None,
    nli: NLIModel | None = None,
    dtype: str | None = None,
) -> list[dict[str, Any]]:
    """Score this shard's questions (resuming); every method's records once all are scored.

    Returns no records while another shard still has questions to score. ``dtype``: the
    one the model was loaded in when the run chose it (the cache then holds only its runs).
    """
    answering = answering or Answering()
    parts = parts or Parts()
    judges = Judges(semantic.similarity, nli)
    if not isinstance(backend, SAMPLERS):  # the sampling baselines need one
        msg = f"{type(backend).__name__} cannot sample: the baselines need an HF or llama.cpp one"
        raise ConfigurationError(msg)
    examples = load_examples(path, limit=limit, seed=0)
    dataset = path.parent.name
    para_file = path.parent / "paraphrase.jsonl"
    para = FixedVariants.from_jsonl(para_file) if para_file.is_file() else None
    header = {"data": str(path), "model": backend.model_id, **answering.describe(),
              "L": L_MAX, "k": K_MAX, "soc": SkipOneChar().describe(),
              "methods": 3, "nli": judges.describe()}  # fmt: skip
    if getattr(backend, "chat_template", None):  # a template of the run's own (a base model)
        header["chat_template"] = backend.chat_template
    if dtype is not None:
        header["dtype"] = dtype
    cache = Cache(cache_dir, f"{dataset}-closed", header)
    k, n = shard
    done = cache.done()
    mine = [(i, e) for i, e in enumerate(examples)
            if i % n == k and not (i in done and parts.covered(done[i]))]  # fmt: skip
    top = {i for i, _ in mine if i in done and _lacks_sampling_only(done[i], parts)}
    cache.fill(shard, [(i, e) for i, e in mine if i not in top], batch,
               lambda chunk: score_batch(backend, list(chunk), para=para, judges=judges,
                                         answering=answering, parts=parts))  # fmt: skip
    cache.fill(shard, [(done[i], e) for i, e in mine if i in top], batch,
               lambda chunk: top_up(backend, list(chunk), judges=judges,
                                    answering=answering))  # fmt: skip
    done = cache.done()
    rows = [done[i] for i in range(len(examples)) if i in done and parts.covered(done[i])]
    if len(rows) < len(examples):
        print(f"  {dataset}: {len(rows)}/{len(examples)} scored; the other shards go on",
              flush=True)  # fmt: skip
        return []
    return report(examples, rows, cache, semantic=semantic)


def report(
    examples: list[Example],
    rows: list[dict[str, Any]],
    cache: Cache,
    *,
    semantic: Semantic,
) -> list[dict[str, Any]]:
    """Every method's records on one data set.

    Each method's AUROC is on the questions it scored (all of them for ESI and the free
    signals; the first ``--sampling-limit`` for the sampling baselines); each paired
    difference on the questions both methods scored.
    """
    kept = [(e, r) for e, r in zip(examples, rows, strict=True) if ESI in r["scores"]]
    labeller: Labeller = semantic if any(e.incorrect for e in examples) else Containment()
    questions, answers = [e.question for e, _ in kept], [r["answer"] for _, r in kept]
    right = labeller.label(questions, answers, [e.answers for e, _ in kept],
                           [e.incorrect for e, _ in kept])  # fmt: skip
    wrong = {r["index"]: int(not ok) for (_, r), ok in zip(kept, right, strict=True)}
    methods = list(dict.fromkeys(m for _, r in kept for m in r["scores"]))
    values = {m: {r["index"]: r["scores"][m] for _, r in kept if m in r["scores"]}
              for m in methods}  # fmt: skip
    t = _stage_seconds(rows)
    notes = dict(NOTES)
    if cache.header.get("nli"):
        model = cache.header["nli"]
        notes |= {"semantic entropy": f"equivalence: entailment both ways by {model}",
                  "SAR (sentence)": f"relevance: {model}; sentence level only",
                  "SAR": f"token and sentence relevance: {model}"}  # fmt: skip
    plain = t["generate"]
    dataset = cache.name.removesuffix("-closed")
    n = len(kept)
    common = {"dataset": dataset, "accuracy": 1 - sum(wrong.values()) / n,
              "labels": labeller.name, "n_unscored": len(rows) - n}  # fmt: skip
    combined = _combined(values, wrong)
    half: dict[int, int] = {}  # the cross-fitted score's half: AUROCs are taken within each
    if combined is not None:
        values[COMBINED], half = combined
    records = []
    for method, scores in values.items():
        labels = [wrong[i] for i in scores]
        groups = [half[i] for i in scores] if method == COMBINED else None
        estimate = bootstrap(auroc, list(scores.values()), labels, n_resamples=2000,
                             groups=groups)  # fmt: skip
        cost = plain + _extra(method, t)
        record = {
            **common, "method": method, "n": len(scores), "auroc": estimate.value,
            "auroc_low": estimate.low, "auroc_high": estimate.high,
            "seconds_per_example": cost, "extra_seconds_per_example": cost - plain,
            "note": notes.get(method, ""),
        }  # fmt: skip
        if method == COMBINED:
            record["ece"] = expected_calibration_error(list(scores.values()), labels)
            record["note"] = ("fitted on one half, measured on the other, both ways; AUROC "
                              "the mean of the two halves' AUROCs")  # fmt: skip
        records.append(record)
    records.append({**common, "method": "plain greedy answer", "n": n, "auroc": None,
                    "seconds_per_example": plain, "extra_seconds_per_example": 0.0,
                    "note": "no guard"})  # fmt: skip
    for first, second in _pairs(values, wrong):
        both = [i for i in values[first] if i in values[second]]
        groups = [half[i] for i in both] if COMBINED in (first, second) else None
        diff = paired_difference(auroc, [values[first][i] for i in both],
                                 [values[second][i] for i in both], [wrong[i] for i in both],
                                 n_resamples=2000, groups=groups)  # fmt: skip
        records.append({**common, "method": f"{first} - {second}", "paired": True,
                        "n": len(both), "auroc_difference": diff.value, "low": diff.low,
                        "high": diff.high})  # fmt: skip
    return records


def _lacks_sampling_only(record: dict[str, Any], parts: Parts) -> bool:
    """Whether a cached record needs only the sampling part now (topped up, not redone)."""
    had, need = _had(record), parts.needs(record["index"])
    others = all(had[part] or not need[part] for part in need if part != "sampling")
    return not had["sampling"] and need["sampling"] and others


def _had(record: dict[str, Any]) -> dict[str, bool]:
    """The parts a cached record has (a record from before a part existed has it)."""
    had = record.get("parts", {})
    return {part: had.get(part, True) for part in ("sampling", "ablation", "fidelity")}


def _stage_seconds(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Mean seconds per question of each stage, over the questions that ran it."""
    total: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for r in rows:
        for stage, s in r["seconds"].items():
            total[stage] += s
            count[stage] += 1
    return defaultdict(lambda: float("nan"), {k: total[k] / count[k] for k in total})


def _extra(method: str, t: dict[str, float]) -> float:
    """Seconds per question a method needs beyond the greedy answer."""
    full = t[f"force L={L_MAX}"]
    sampled = t["sample"] + (t["rouge"] if "ROUGE" in method else t[f"judge {method}"])
    extra = {
        **{f"ESI(SOC) L={L}": t[f"force L={L}"] for L in LS},
        "ESI(Para) L=10": t["force para"], "ESI(Para) L=5": t["force para"] / 2,
        **{name: t[f"force {name}"] for name in FIDELITY},
        "NLL (greedy)": 0.0, "mean token entropy": 0.0, "LN-PE": t["sample"],
        "lexical similarity (ROUGE-L)": sampled, "semantic entropy": sampled,
        "SAR (sentence)": sampled, "SAR": sampled, "P(True)": t["p_true"],
    }  # fmt: skip
    return extra.get(method, full)  # the rest come from the L=10 pass (combined too)


def _combined(
    values: dict[str, dict[int, float]], wrong: dict[int, int]
) -> tuple[dict[int, float], dict[int, int]] | None:
    """Cross-fitted P(wrong): each half's from the model fitted on the other half.

    With each question's half: two fitted models' outputs are not on one scale, so the
    report measures each half on its own and averages (``groups`` in the bootstrap).
    """
    names = {"esi": ESI, "nll": "NLL (greedy)", "entropy": "mean token entropy"}
    order = list(values[ESI])
    signals = {i: {k: values[m][i] for k, m in names.items()} for i in order}
    halves = [order[0::2], order[1::2]]
    out: dict[int, float] = {}
    for fit, apply in (halves, halves[::-1]):
        try:
            model = fit_combined([signals[i] for i in fit], [wrong[i] for i in fit])
        except ConfigurationError:  # too few right (or wrong) answers in a half
            return None
        out |= {i: model.p_wrong(signals[i]) for i in apply}
    return {i: out[i] for i in order}, {i: n % 2 for n, i in enumerate(order)}


def _pairs(values: dict[str, dict[int, float]], wrong: dict[int, int]) -> list[tuple[str, str]]:
    """The paired comparisons the report gives.

    ESI against each other method, the default against each fidelity choice, and the
    combined score against the best of what it combines.
    """
    pairs = [(ESI, m) for m in values if not m.startswith("ESI") and m != COMBINED]
    pairs += [(ESI, m) for m in (*FIDELITY, SUPPORT_ALL, "ESI(SOC) kl") if m in values]
    if "ESI(Para) L=5" in values:
        pairs.append(("ESI(Para) L=10", "ESI(Para) L=5"))
    if COMBINED in values:
        parts = (ESI, "NLL (greedy)", "mean token entropy")
        best = max(parts, key=lambda m: auroc(list(values[m].values()),
                                              [wrong[i] for i in values[m]]))  # fmt: skip
        pairs.append((COMBINED, best))
    return pairs
