r"""Collected probe runs as an ``esi-guard calibrate`` cache: calibrate on hours of scoring at once.

    python -m benchmarks.probe export --cache ~/.cache/esi_guard/bench-probe \\
        --name sciq-qwen2-5-coder-1-5b-instruct-q4-k-m --model qwen2.5-coder-1.5b \\
        --out sciq-1.5b.jsonl
    esi-guard calibrate --model qwen2.5-coder-1.5b --data ../shared/data/sciq/test.jsonl \\
        --limit 600 --seed 0 --cache sciq-1.5b.jsonl --score combined \\
        --features esi,nll,entropy,max_nll,hidden --out threshold.json

``collect`` scores a question the way the guard does on llama.cpp (the CLI's system prompt,
SOC at L=10, k=100, Hellinger, the free signals, the hidden states from the answer's own
decodes), so its records are a calibration run already; this writes them as one. The cache's
header is the one ``calibrate`` itself would write for the command it names (built from a
guard on ``--model``: the model is loaded, nothing is scored), so ``calibrate`` finds every
example there and loads no model. Refused rather than approximated:

* a run on another model file (sha256), engine or scoring than the guard's, or asked with a
  template (a RAG run: calibrate asks its own way) or a few-shot prompt;
* a question not the calibration set's (``--limit`` and ``--seed 0`` of the same file);
* ``--max-new-tokens`` above the run's 24 unless every answer ended before 24 tokens (an
  answer that stopped is the same answer under any larger limit).

Two differences, both rounding: ``collect`` forced each variant in a llama.cpp decode of its
own (``pack_rows=False``) where the guard packs them (ESI within 0.009 on the embedded model:
``tests/integration/test_llamacpp_packing.py``), and it kept the states in float16. A
probe's candidate layers are those of the run nearest to the ones ``calibrate`` reads
(:func:`~esi_guard.combined.probe_window`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from benchmarks.probe.data import load, run_header
from esi_guard.backends import FINAL, HiddenSpec, file_sha256
from esi_guard.calibration.calibrate_combined import encode_states
from esi_guard.calibration.data import dataset_hash, load_files
from esi_guard.calibration.file import ThresholdFile
from esi_guard.cli import build
from esi_guard.cli.run.cache import RunHeader
from esi_guard.guard import ESIGuard
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS

__all__ = ["export"]

NO_VARIANT = (
    "no_effective_variant: no variant differs from the question (skip_one_char found "
    "nothing to change)"
)
"""The guard's reason where SOC changed nothing (``collect`` has no ESI there)."""


def export(
    cache_dir: Path,
    names: Sequence[str],
    *,
    model: str,
    out: Path,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    threshold: Path | None = None,
    allow_cut: bool = False,
    limit: int | None = None,
) -> str:
    """Write runs ``names`` (in order) as one calibrate cache at ``out``; its command.

    With ``threshold`` (a threshold file) the cache is ``esi-guard evaluate``'s for that
    file instead: evaluate computes each answer's ``p_wrong`` from the cached signals and
    states, no model call. ``allow_cut``: keep answers cut at the run's limit as they are
    where the guard would have gone on (for a held-out check, counted in the command's line).
    ``limit``: each run's first ``limit`` questions only (calibrate on those, measure the
    rest held out: ``benchmarks.results.heldout --skip``).
    """
    headers = [run_header(cache_dir, name) for name in names]
    runs = [load(cache_dir, name) for name in names]
    if limit is not None:
        short = [name for name, run in zip(names, runs, strict=True) if len(run.records) < limit]
        if short:
            _stop(f"{', '.join(short)}: fewer than --limit {limit} questions collected")
        runs = [run._replace(records=run.records[:limit], hidden=run.hidden[:limit],
                             labels={k: v[:limit] for k, v in run.labels.items()})
                for run in runs]  # fmt: skip
    for name, header, run in zip(names, headers, runs, strict=True):
        _check_run(name, header, run.records, max_new_tokens, allow_cut)
    first = headers[0]
    for name, header in zip(names[1:], headers[1:], strict=True):
        for key in ("model", "engine", "system", "L", "k", "soc", "layers", "positions"):
            if header[key] != first[key]:
                _stop(f"{name}: {key} {header[key]!r}, not {first[key]!r} as {names[0]}")
    limits = {len(run.records) for run in runs}
    if len(limits) != 1:
        _stop(f"the runs hold {sorted(limits)} questions: calibrate --limit is one")
    (limit,) = limits
    data = [Path(header["data"]) for header in headers]
    examples = load_files(data, limit=limit, seed=0)
    chosen = build.ModelOptions(model)
    scoring = build.ScoringOptions("soc", first["L"], first["k"], "hellinger", max_new_tokens)
    guard = build.guard(chosen, scoring, hidden=True)
    if guard.backend.engine != first["engine"]:
        _stop(f"--model runs on {guard.backend.engine}; the runs on {first['engine']}")
    if guard.backend.model_sha256 != file_sha256(first["model"]):
        _stop(f"--model {model} is not the file the runs scored ({first['model']})")
    if guard.intervention.describe() != first["soc"]:
        _stop(f"the runs' SOC {first['soc']} is not the guard's")
    system = first["system"]
    if threshold is None:  # calibrate's request
        request = {**chosen.request(), **scoring.request(), "hidden_states": True}
    else:  # evaluate's
        request = {**chosen.request(), "threshold": _evaluated(threshold, guard, system)}
    request |= {"system_prompt": system, "prompt_template": None}
    digest = dataset_hash(examples)
    spec = _nearest(HiddenSpec(tuple(first["layers"]), tuple(first["positions"])),
                    guard.hidden_states)  # fmt: skip
    cache_header = replace(RunHeader.of(guard, digest, system, None, request), hidden_states=spec)
    lines = [json.dumps(cache_header.as_json())]
    offset = 0
    for run in runs:
        columns = [run.spec.layers.index(layer) for layer in spec.layers]
        for i, (record, states) in enumerate(zip(run.records, run.hidden, strict=True)):
            example = examples[offset + i]
            if record["question"] != example.question:
                _stop(f"question {offset + i} is not calibrate's: {record['question']!r}")
            values = states[columns].astype(np.float32)
            lines.append(json.dumps(_record(offset + i, example.answers, record, spec, values)))
        offset += len(run.records)
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    cut = sum(r.get("finish_reason") != "stop" for run in runs for r in run.records)
    if cut and max_new_tokens != first["max_new_tokens"]:
        print(f"  kept as they are: {cut} answers cut at {first['max_new_tokens']} tokens")
    data_args = " ".join(f"--data {path}" for path in data)
    if threshold is not None:
        return (f"esi-guard evaluate --threshold {threshold} --model {model} {data_args} "
                f"--limit {limit} --seed 0 --cache {out}")  # fmt: skip
    return (f"esi-guard calibrate --model {model} {data_args} --limit {limit} --seed 0 "
            f"--max-new-tokens {max_new_tokens} --cache {out} --score combined ...")  # fmt: skip


def _evaluated(threshold: Path, guard: ESIGuard, system: str) -> dict[str, Any]:
    """What evaluate's request records of the file, once checked against the runs."""
    calibrated = ThresholdFile.read(threshold)
    settings = calibrated.scoring
    ours = guard.scoring_config.model_copy(update={"system_prompt": system})
    differ = settings.differences(ours, ignore=("prompt_template",))
    if differ or calibrated.model_sha256 != guard.backend.model_sha256:
        _stop(f"{threshold} scores otherwise than the runs: {differ or 'its model'}")
    return calibrated.model_dump(mode="json", include={"scoring", "combined",
                                 "esi_probe", "probe_band", "free_score"})  # fmt: skip


def _stop(message: str) -> NoReturn:
    """End the command with ``message`` (what was refused and why)."""
    raise SystemExit(message)


def _check_run(
    name: str, header: dict[str, Any], records: Sequence[dict[str, Any]], max_new_tokens: int,
    allow_cut: bool,
) -> None:  # fmt: skip
    if header.get("template") or header.get("chat_template") or header.get("stop"):
        _stop(f"{name} was asked with a template or few-shot prompt: not calibrate's")
    if header["labels"] != "containment":
        _stop(f"{name} is labelled {header['labels']}; calibrate's default: containment")
    if sorted(r["index"] for r in records) != list(range(len(records))):
        _stop(f"{name} lacks some of its first {len(records)} questions: collect more")
    if max_new_tokens != header["max_new_tokens"]:
        cut = [r["index"] for r in records if r.get("finish_reason") != "stop"]
        if max_new_tokens < header["max_new_tokens"] or (cut and not allow_cut):
            limit = header["max_new_tokens"]
            _stop(f"{name}: {len(cut)} answers cut at {limit} tokens: --max-new-tokens {limit}")


def _nearest(collected: HiddenSpec, wanted: HiddenSpec | None) -> HiddenSpec:
    """The collected layers nearest to each of ``wanted``'s (FINAL to FINAL)."""
    if wanted is None:
        _stop("the guard reads no hidden states: not a white-box backend")
    blocks = [layer for layer in collected.layers if layer != FINAL]
    picked = [layer if layer == FINAL else min(blocks, key=lambda b: (abs(b - layer), b))
              for layer in wanted.layers]  # fmt: skip
    return HiddenSpec(tuple(dict.fromkeys(picked)), collected.positions)


def _record(
    index: int, answers: Sequence[str], record: dict[str, Any], spec: HiddenSpec,
    values: np.ndarray,
) -> dict[str, Any]:  # fmt: skip
    base = {"index": index, "question": record["question"], "answers": list(answers)}
    scores = record["scores"]
    if "esi" not in scores:
        return {**base, "prediction": record["answer"], "score": None, "scored": False,
                "reason": NO_VARIANT}  # fmt: skip
    states = encode_states({"layers": spec.layers, "positions": spec.positions, "values": values})
    return {**base, "hidden": states, "prediction": record["answer"], "score": scores["esi"],
            "scored": True, "reason": None,
            "variant_scores": list(record["variants"]),
            "signals": {key: scores[key] for key in ("nll", "entropy", "max_nll")},
            "p_wrong": None, "variants_used": len(record["variants"])}  # fmt: skip
