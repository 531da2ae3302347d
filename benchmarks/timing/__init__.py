r"""Every timing benchmark behind one command, one module per subject.

    python -m benchmarks.timing SUBJECT [options] [--json FILE]
    python -m benchmarks.timing cascade --help

Each subject's module gives ``add_arguments(parser)`` (its options) and ``measure(args)``
(it prints its figures and returns the record ``--json`` writes, or None); this module owns
the command line and the ``--json`` file. The side-by-side subjects (``cascade``,
``forcing``) time their arms with :func:`benchmarks.common.side_by_side`, the one
guarded/plain loop (``python -m benchmarks.results.decisions cost`` uses it too); the
others time what only they measure (an agent's turns, HTTP load, engine builds in
subprocesses, GPU batches) and keep their own loops.
"""

from __future__ import annotations

import argparse
import importlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["SUBJECTS", "main"]

SUBJECTS = {
    "cascade": "cascade",
    "forcing": "forcing",
    "engines": "engines",
    "kernels": "kernels",
    "streaming": "streaming",
    "sentences": "sentences",
    "rag": "rag",
    "agent": "agent",
    "api": "api",
    "server": "server",
    "ray": "ray",
    "llamacpp-build": "llamacpp_build",
    "llamacpp-ranked": "llamacpp_ranked",
    "gpu": "gpu",
    "prefix": "prefix",
    "probe-search": "probe_search",
}
"""Subject -> its module under ``benchmarks.timing``."""
NO_RECORD = frozenset({"streaming", "rag"})
"""Subjects that only print (no ``--json``)."""


def parser() -> argparse.ArgumentParser:
    """The command line: a subparser per subject, its module's options and ``--json``."""
    top = argparse.ArgumentParser(
        prog="python -m benchmarks.timing", description=__doc__.splitlines()[0]
    )
    subjects = top.add_subparsers(dest="subject", required=True, metavar="SUBJECT")
    for name, module_name in SUBJECTS.items():
        module = importlib.import_module(f"benchmarks.timing.{module_name}")
        doc = module.__doc__ or name
        sub = subjects.add_parser(
            name, help=doc.splitlines()[0], description=doc,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        module.add_arguments(sub)
        if name not in NO_RECORD:
            sub.add_argument("--json", type=Path, help="write the record here")
        sub.set_defaults(measure=module.measure)
    return top


def main(argv: Sequence[str] | None = None) -> Any:
    """Run one subject; write its record to ``--json``; return the record."""
    args = parser().parse_args(argv)
    record = args.measure(args)
    if getattr(args, "json", None) is not None and record is not None:
        args.json.write_text(json.dumps(record, indent=1))
    return record
