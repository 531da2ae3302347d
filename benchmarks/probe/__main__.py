r"""The hidden-state probe's commands: ``collect`` a run, ``report`` its tables, ``export`` it.

    OMP_NUM_THREADS=1 python -m benchmarks.probe collect --data ../shared/data/sciq/test.jsonl \\
        --limit 1000 --cache .bench-cache/probe --shard 0/2        # and 1/2 beside it
    OMP_NUM_THREADS=1 python -m benchmarks.probe report --cache .bench-cache/probe \\
        --json probe.json --markdown probe.md

What ``collect`` records and how it caches it: :mod:`benchmarks.probe.collect`; what
``report`` measures: :mod:`benchmarks.probe.report`; reading a run back:
:mod:`benchmarks.probe.data`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.probe.collect import TIMING_QUESTIONS, collect
from benchmarks.probe.data import runs
from benchmarks.probe.export import export
from benchmarks.probe.report import markdown, report
from benchmarks.shared_data import shared_data
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """``collect``: one data set on one model, this shard's questions; ``report``: the tables."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.probe", description=__doc__.splitlines()[0]
    )
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
    out = commands.add_parser("export", help="runs as an esi-guard calibrate cache")
    out.add_argument("--cache", type=Path, default=Path(".bench-cache/probe"))
    out.add_argument("--name", action="append", required=True,
                     help="a run (sciq-...); several: one cache, in this order")  # fmt: skip
    out.add_argument("--model", required=True, help="as calibrate will be given it")
    out.add_argument("--max-new-tokens", type=int, default=DEFAULT_MAX_NEW_TOKENS)
    out.add_argument("--out", type=Path, required=True)
    out.add_argument("--allow-cut", action="store_true",
                     help="keep answers cut at the run's limit (a held-out check)")  # fmt: skip
    out.add_argument("--threshold", type=Path,
                     help="a threshold file: write esi-guard evaluate's cache for it")  # fmt: skip
    out.add_argument("--limit", type=int, default=None,
                     help="each run's first N questions only (the rest: held out)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.command == "export":
        command = export(args.cache, args.name, model=args.model, out=args.out,
                         max_new_tokens=args.max_new_tokens,
                         threshold=args.threshold, allow_cut=args.allow_cut,
                         limit=args.limit)  # fmt: skip
        print(f"wrote {args.out}; run with no model call:\n  {command}")
        return
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
