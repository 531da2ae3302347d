r"""A threshold file's decisions on questions it was not fitted on, from calibrate's caches.

    esi-guard calibrate --data heldout-sciq.jsonl --cache held-sciq.jsonl --score combined \
        --features esi,nll,entropy,max_nll,repetition,hidden --out /dev/null ...
    python -m benchmarks.results.heldout esi_guard/shipped/smollm2-135m-instruct-q4_1.json \
        held-sciq.jsonl held-triviaqa.jsonl held-nq_open.jsonl --markdown heldout.md

What ``esi-guard evaluate`` reports (the file's score as its ``cached_p_wrong`` gives
it, AUROC, ECE, realised coverage and selective risk at the file's threshold), read from
caches ``esi-guard calibrate`` wrote for the held-out questions (ESI, the free signals and
the hidden states of each answer) instead of scoring them again: one scoring run serves
every file measured on the same questions (a combined-score file and an ESI-alone one).
Labels by containment, as calibrate gives them. With a combined score, ESI alone beside
it and their paired difference on the same questions (95% bootstrap intervals).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esi_guard.calibration.file import ThresholdFile
from esi_guard.calibration.labels import Containment
from esi_guard.calibration.metrics import (
    auroc,
    bootstrap,
    expected_calibration_error,
    paired_difference,
)
from esi_guard.cli.evaluate import cached_p_wrong

__all__ = ["heldout", "main"]


def heldout(file: Path, cache: Path, *, n_resamples: int = 2000, skip: int = 0) -> dict[str, Any]:
    """The file's figures on the scored answers of one calibrate cache.

    ``skip``: leave out the cache's first ``skip`` questions (by index): the ones the file
    was fitted on, where one cache holds both (calibrate on the first N, measure the rest).
    """
    calibrated = ThresholdFile.read(file)
    lines = cache.read_text(encoding="utf-8").splitlines()
    records = [record for record in map(json.loads, lines[1:])
               if record.get("scored") and int(record["index"]) >= skip]  # fmt: skip
    if not records:
        msg = f"{cache}: no scored answer" + (f" from question {skip} on" if skip else "")
        raise SystemExit(msg)
    label = Containment()
    wrong = [int(not label.right(r["prediction"], r["answers"])) for r in records]
    esi = [float(r["score"]) for r in records]
    combined = calibrated.combined
    scores = esi if combined is None else [cached_p_wrong(r, combined) for r in records]
    accepted = [w for s, w in zip(scores, wrong, strict=True) if s <= calibrated.threshold]
    out: dict[str, Any] = {
        "cache": cache.name if not skip else f"{cache.name} from {skip}",
        "n": len(records),
        "right": 1 - sum(wrong) / len(wrong),
        "on": "ESI" if combined is None else "p_wrong",
        "threshold": calibrated.threshold,
        "auroc": bootstrap(auroc, scores, wrong, n_resamples=n_resamples),
        "coverage": len(accepted) / len(scores),
        "selective_risk": sum(accepted) / len(accepted) if accepted else None,
        "all_wrong": sum(wrong) / len(wrong),
    }
    if combined is not None:
        out["ece"] = expected_calibration_error(scores, wrong)
        out["esi_auroc"] = bootstrap(auroc, esi, wrong, n_resamples=n_resamples)
        out["minus_esi"] = paired_difference(auroc, scores, esi, wrong, n_resamples=n_resamples)
    return out


def table(file: Path, rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    header = "| held out | n | right | AUROC | coverage | selective risk (all) | ECE | ESI alone |"
    lines = [
        f"{file.name}: threshold {rows[0]['threshold']:.4f} on {rows[0]['on']}",
        "",
        header + " file - ESI alone |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        risk = "n/a" if row["selective_risk"] is None else f"{row['selective_risk']:.3f}"
        extra = "| | |"
        if "ece" in row:
            extra = f"| {row['ece']:.3f} | {row['esi_auroc']} | {row['minus_esi']} |"
        lines.append(
            f"| {row['cache']} | {row['n']} | {row['right']:.3f} | {row['auroc']} | "
            f"{row['coverage']:.3f} | {risk} ({row['all_wrong']:.3f}) {extra}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Measure the file on each cache; print (and with ``--markdown`` write) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file", type=Path, help="a threshold file")
    parser.add_argument("caches", type=Path, nargs="+", help="calibrate caches of held-out sets")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--skip", type=int, default=0,
                        help="leave out each cache's first N questions (fitted on)")  # fmt: skip
    args = parser.parse_args(argv)
    rows = [heldout(args.file, cache, n_resamples=args.resamples, skip=args.skip)
            for cache in args.caches]  # fmt: skip
    text = table(args.file, rows)
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n", encoding="utf-8")
    return rows


if __name__ == "__main__":
    main()
