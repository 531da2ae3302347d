r"""ESI side by side with the baselines: AUROC and wall time per example, in ONE run.

    python benchmarks/run.py --data ../shared/data/sciq/test.jsonl \\
        --data ../shared/data/truthfulqa/TruthfulQA.csv --limit 200 --json out.json

For each data set, on the same model (the embedded SmolLM2 by default) and the same
questions, with the same correctness labels for every method (normalised containment;
semantic similarity, with the known wrong answers, for TruthfulQA), it computes:

* ESI(SOC) at the paper's defaults (L=10, k=100, Hellinger) and ESI(Para) with the shared
  precomputed paraphrases (``paraphrase.jsonl`` beside the data, ``FixedVariants``);
* ablations: L in {2, 3, 5, 10} (each teacher-forced and timed on its own), top-k in
  {5, 20, 100} and other distances (from the L=10 pass: rows are sorted, so a top-5 row is
  the first five of the top-100 one; they cost what ESI(SOC, L=10) costs);
* baselines configured as the paper's appendix: greedy NLL and mean token entropy
  (by-products of generation), LN-PE, semantic entropy, ROUGE-L lexical similarity and
  sentence SAR from 10 samples at T=1.0, and P(True). Semantic equivalence and relevance
  use all-MiniLM-L6-v2 cosine similarity (packaged, offline) where the paper uses
  DeBERTa-MNLI / a RoBERTa cross-encoder; the output says so.

Times are wall seconds per example of everything the method needs, generation included,
measured stage by stage in this run. Writes a markdown table (stdout and ``--markdown``)
and a JSON list of records (``dataset``, ``method``, ``auroc``, ``seconds_per_example``,
``n``, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from esi_guard import ConfigurationError, FixedVariants, HFBackend, SkipOneChar, esi_score
from esi_guard.backends import ChatMessage, ForcingRequest, Generation, Sample, Sampler
from esi_guard.baselines import (
    PTRUE_PROMPT,
    lexical_similarity,
    ln_pe,
    mean_token_entropy,
    neg_log_likelihood,
    p_true,
    semantic_entropy,
    sentence_sar,
)
from esi_guard.calibration.data import Example, load_examples
from esi_guard.calibration.labels import Containment, Labeller, Semantic
from esi_guard.calibration.metrics import auroc, bootstrap
from esi_guard.calibration.prompts import DEFAULT_SYSTEM

if not __package__:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.common import Clock, token_logprobs
from benchmarks.rag import markdown as rag_markdown
from benchmarks.rag import run_rag
from benchmarks.sequential import sequential_row

SYSTEM = DEFAULT_SYSTEM  # the paper's QA instruction, as the CLI uses it
L_MAX, K_MAX = 10, 100
LS, KS = (2, 3, 5), (5, 20)
DISTANCES = ("squared_hellinger", "kl", "bhattacharyya")
N_SAMPLES, TEMPERATURE = 10, 1.0
SE_THRESHOLD = 0.8
EMBEDDINGS = "all-MiniLM-L6-v2 cosine"


def prompt(question: str) -> list[ChatMessage]:
    """The paper's QA prompt: instruction as system message, the question as user's."""
    return [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=question)]


def force(
    backend: HFBackend, examples: list[Example], gens: list[Generation], variants: list[list[str]]
) -> list[Any]:
    """Teacher-force each greedy answer after its question's variants."""
    requests = [
        ForcingRequest(prompt=prompt(e.question), variants=[prompt(v) for v in vs],
                       answer_ids=g.token_ids, answer=g.text)
        for e, g, vs in zip(examples, gens, variants, strict=True)
    ]  # fmt: skip
    return list(backend.teacher_force(requests, top_k=K_MAX))


def p_true_scores(
    backend: HFBackend, examples: list[Example], gens: list[Generation]
) -> list[float]:
    """1 - P(True) of the model judging its own greedy answer (next token: A or B)."""
    prompts = [
        [ChatMessage(role="user", content=PTRUE_PROMPT.format(question=e.question, answer=g.text))]
        for e, g in zip(examples, gens, strict=True)
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


def run_dataset(
    backend: HFBackend,
    path: Path,
    limit: int,
    max_new_tokens: int,
    batch: int,
    semantic: Semantic,
    max_disagreement: float = 0.05,
) -> list[dict[str, Any]]:
    """Every method's records on one data set."""
    if not isinstance(backend, Sampler):  # the sampling baselines need one
        msg = f"{type(backend).__name__} cannot sample: the baselines need a Sampler backend"
        raise ConfigurationError(msg)
    examples = load_examples(path, limit=limit, seed=0)
    labeller: Labeller = semantic if any(e.incorrect for e in examples) else Containment()
    similarity = semantic.similarity  # the labeller's model: loaded once
    para_file = path.parent / "paraphrase.jsonl"
    para = FixedVariants.from_jsonl(para_file) if para_file.is_file() else None
    soc = SkipOneChar()
    clock = Clock()
    scores: dict[str, list[float]] = defaultdict(list)
    variant_scores: dict[str, list[list[float]]] = defaultdict(list)
    kept: list[Example] = []
    answers: list[str] = []
    for start in range(0, len(examples), batch):
        chunk = examples[start : start + batch]
        with clock.stage("generate"):
            gens = backend.generate([prompt(e.question) for e in chunk],
                                    max_new_tokens=max_new_tokens, top_k=K_MAX)  # fmt: skip
        pairs = [(e, g) for e, g in zip(chunk, gens, strict=True)
                 if isinstance(g, Generation) and g.token_ids]  # fmt: skip
        if not pairs:
            continue
        chunk, gens = [e for e, _ in pairs], [g for _, g in pairs]
        kept += chunk
        answers += [g.text for g in gens]
        socs = [soc.variants(e.question, L_MAX, seed=0) for e in chunk]
        for n_variants in (*LS, L_MAX):
            with clock.stage(f"force L={n_variants}"):
                forced = force(backend, chunk, gens, [v[:n_variants] for v in socs])
            for g, f in zip(gens, forced, strict=True):
                scores[f"ESI(SOC) L={n_variants}"].append(esi_score(g.topk, f.variants).score)
        for g, f in zip(gens, forced, strict=True):  # the L=10 pass
            variant_scores["ESI(SOC)"].append(list(esi_score(g.topk, f.variants).variant_scores))
            for k in KS:
                ablation = [v.head(k) for v in f.variants]
                scores[f"ESI(SOC) k={k}"].append(esi_score(g.topk.head(k), ablation).score)
            for distance in DISTANCES:
                scores[f"ESI(SOC) {distance}"].append(
                    esi_score(g.topk, f.variants, distance=distance).score  # type: ignore[arg-type]
                )
            scores["NLL (greedy)"].append(neg_log_likelihood(token_logprobs(g)))
            scores["mean token entropy"].append(mean_token_entropy(g.topk.values))
        if para is not None:
            with clock.stage("force para"):
                paras = [para.variants(e.question, L_MAX, seed=0) for e in chunk]
                forced = force(backend, chunk, gens, paras)
            for g, f in zip(gens, forced, strict=True):
                esi = esi_score(g.topk, f.variants)
                scores["ESI(Para) L=10"].append(esi.score)
                variant_scores["ESI(Para)"].append(list(esi.variant_scores))
        with clock.stage("sample"):
            samples = backend.sample(
                [prompt(e.question) for e in chunk], n=N_SAMPLES, temperature=TEMPERATURE,
                max_new_tokens=max_new_tokens,
            )  # fmt: skip
        for per in samples:
            assert not isinstance(per, Exception)
            usable: list[Sample] = [s for s in per if s.token_logprobs] or per
            scores["LN-PE"].append(ln_pe(usable))
            with clock.stage("rouge"):
                scores["lexical similarity (ROUGE-L)"].append(lexical_similarity(usable))
            with clock.stage("embed"):
                scores["semantic entropy"].append(
                    semantic_entropy(usable, similarity, SE_THRESHOLD)
                )
                scores["SAR (sentence)"].append(sentence_sar(usable, similarity))
        with clock.stage("p_true"):
            scores["P(True)"] += p_true_scores(backend, chunk, gens)
        print(f"  {path.parent.name}: {len(kept)}/{len(examples)}", flush=True)

    right = labeller.label([e.question for e in kept], answers, [e.answers for e in kept],
                           [e.incorrect for e in kept])  # fmt: skip
    wrong = [int(not r) for r in right]
    n = len(kept)
    t = {name: seconds / max(n, 1) for name, seconds in clock.seconds.items()}
    cost = {
        "ESI(SOC) L=10": t["generate"] + t["force L=10"],
        **{f"ESI(SOC) L={L}": t["generate"] + t[f"force L={L}"] for L in LS},
        **{f"ESI(SOC) k={k}": t["generate"] + t["force L=10"] for k in KS},
        **{f"ESI(SOC) {d}": t["generate"] + t["force L=10"] for d in DISTANCES},
        "ESI(Para) L=10": t["generate"] + t.get("force para", float("nan")),
        "NLL (greedy)": t["generate"],
        "mean token entropy": t["generate"],
        "LN-PE": t["generate"] + t["sample"],
        "lexical similarity (ROUGE-L)": t["generate"] + t["sample"] + t["rouge"],
        "semantic entropy": t["generate"] + t["sample"] + t["embed"] / 2,
        "SAR (sentence)": t["generate"] + t["sample"] + t["embed"] / 2,
        "P(True)": t["generate"] + t["p_true"],
    }
    notes = {
        "semantic entropy": f"equivalence: {EMBEDDINGS} >= {SE_THRESHOLD} both ways "
        "(paper: DeBERTa-MNLI)",
        "SAR (sentence)": f"relevance: {EMBEDDINGS} (paper: RoBERTa cross-encoder); sentence "
        "level only",
        "ESI(Para) L=10": f"precomputed paraphrases ({para_file.name}), SOC top-up",
    }
    common = {"dataset": path.parent.name, "n": n, "accuracy": 1 - sum(wrong) / n,
              "labels": labeller.name}  # fmt: skip
    records = []
    for method, values in scores.items():
        estimate = bootstrap(auroc, values, wrong, n_resamples=2000)
        records.append({
            **common, "method": method, "auroc": estimate.value, "auroc_low": estimate.low,
            "auroc_high": estimate.high, "seconds_per_example": cost[method],
            "extra_seconds_per_example": cost[method] - t["generate"],
            "note": notes.get(method, ""),
        })  # fmt: skip
    records.append({**common, "method": "plain greedy answer", "auroc": None,
                    "seconds_per_example": t["generate"], "extra_seconds_per_example": 0.0,
                    "note": "no guard"})  # fmt: skip
    messages = [[("system", SYSTEM), ("human", e.question)] for e in kept]
    for name, intervention in (("ESI(SOC)", soc), ("ESI(Para)", para)):
        if intervention is None or not variant_scores[name]:
            continue
        row = sequential_row(
            backend, messages, variant_scores[name], wrong, name=name,
            intervention=intervention, clock=clock, generate_seconds=t["generate"],
            max_new_tokens=max_new_tokens, batch=batch, max_disagreement=max_disagreement,
        )  # fmt: skip
        records.append({**common, **row})
    return records


def _has_passages(path: Path) -> bool:
    return load_examples(path, limit=1)[0].context is not None


def _auroc(record: dict[str, Any]) -> str:
    if record.get("auroc") is None or record["auroc"] != record["auroc"]:  # None or NaN
        return ""
    if record.get("auroc_low") is None:
        return f"{record['auroc']:.3f}"
    return f"{record['auroc']:.3f} [{record['auroc_low']:.2f}, {record['auroc_high']:.2f}]"


def _seconds(record: dict[str, Any]) -> str:
    if "seconds_per_example" not in record:
        return ""
    extra = record.get("extra_seconds_per_example")
    whole = f"{record['seconds_per_example']:.2f}"
    return whole if extra is None else f"{whole} ({extra:.2f})"


def markdown(records: list[dict[str, Any]]) -> str:
    """AUROC and seconds per example, methods by data sets, and the speed ratios."""
    rag = [r for r in records if r.get("target")]
    records = [r for r in records if not r.get("target")]
    if not records:
        return rag_markdown(rag)
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    cell = {(r["dataset"], r["method"]): r for r in records}
    head = "| method | " + " | ".join(f"{d} AUROC [95% CI] | {d} s/ex (extra)" for d in datasets)
    lines = [head + " |", "|---" * (1 + 2 * len(datasets)) + "|"]
    for method in methods:
        row = []
        for d in datasets:
            r = cell.get((d, method))
            row += ["", ""] if r is None else [_auroc(r), _seconds(r)]
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        "n / accuracy / labels: "
        + "; ".join(
            f"{d}: {cell[(d, 'NLL (greedy)')]['n']} / {cell[(d, 'NLL (greedy)')]['accuracy']:.3f}"
            f" / {cell[(d, 'NLL (greedy)')]['labels']}"
            for d in datasets
        )
    )
    for d in datasets:
        esi = cell[(d, "ESI(SOC) L=10")]
        se = cell[(d, "semantic entropy")]
        plain = cell[(d, "plain greedy answer")]["seconds_per_example"]
        line = (
            f"{d}: semantic entropy / ESI(SOC, L=10) time = "
            f"{se['seconds_per_example'] / esi['seconds_per_example']:.2f}x"
        )
        if "extra_seconds_per_example" in esi:
            line += (
                f" (beyond the answer: {se['extra_seconds_per_example']:.2f} s vs "
                f"{esi['extra_seconds_per_example']:.2f} s, "
                f"{se['extra_seconds_per_example'] / esi['extra_seconds_per_example']:.2f}x)"
            )
        line += (
            f"; ESI(SOC, L=10) / plain greedy answer = {esi['seconds_per_example'] / plain:.2f}x"
        )
        lines.append(line)
        for name in ("ESI(SOC) sequential", "ESI(Para) sequential"):
            r = cell.get((d, name))
            if r is None or not r.get("n"):
                continue
            seq, whole = r["seconds_per_example"], r["full_guard_seconds_per_example"]
            lines.append(
                f"{d}: {name}: variants_used_mean {r['variants_used_mean']:.2f}, "
                f"decision_agreement {r['decision_agreement']:.3f} (n={r['n']}); guarded call "
                f"{seq:.2f} s vs full L {whole:.2f} s ({seq / whole:.2f}x), "
                f"vs plain {seq / plain:.2f}x. {r['note']}"
            )
    if rag:
        lines += ["", rag_markdown(rag)]
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments and run every data set."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, action="append", default=[])
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--json", type=Path, help="write the records here (needed with --data)")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--model", default="default", help="'default' or a HF id/path")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8, help="questions per batched call")
    parser.add_argument(
        "--max-disagreement",
        type=float,
        default=0.05,
        help="sequential ESI: the bound its stopping rule is fitted to (early vs full-L)",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(".bench-cache"),
        help="per-question cache of the RAG (squad2) runs; they resume from it",
    )
    parser.add_argument(
        "--shard",
        default="0/1",
        metavar="K/N",
        help="RAG runs: score the questions i with i %% N == K (run N side by side)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the data sets already in --json and run only the others",
    )
    parser.add_argument(
        "--table",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="print (and --markdown) the table of earlier runs' JSON; no run",
    )
    args = parser.parse_args()
    if args.table:
        records = [r for path in args.table for r in json.loads(path.read_text())]
        table = markdown(records)
        print(table)
        if args.markdown:
            args.markdown.write_text(table + "\n")
        return
    if not args.data or args.json is None:
        parser.error("give --data PATH (one or more) and --json OUT.json, or --table JSON...")

    backend = (
        HFBackend.default() if args.model == "default" else HFBackend.from_pretrained(args.model)
    )
    semantic = Semantic()
    records: list[dict[str, Any]] = []
    if args.resume and args.json.is_file():
        records = json.loads(args.json.read_text())
    done = {r["dataset"] for r in records}
    for path in args.data:
        if path.parent.name in done:
            print(f"  {path.parent.name}: kept from {args.json}", flush=True)
            continue
        if _has_passages(path):
            k, _, n = args.shard.partition("/")
            records += run_rag(backend, path, limit=args.limit, max_new_tokens=args.max_new_tokens,
                               batch=args.batch, semantic=semantic, cache_dir=args.cache,
                               shard=(int(k), int(n)))  # fmt: skip
        else:
            records += run_dataset(backend, path, args.limit, args.max_new_tokens, args.batch,
                                   semantic, args.max_disagreement)  # fmt: skip
        args.json.write_text(json.dumps(records, indent=1))  # kept after each data set
    table = markdown(records)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
