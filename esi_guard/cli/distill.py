"""``esi-guard distill``: an ESI probe from unlabelled questions (labels are never read).

Runs full ESI into a resumable cache like ``calibrate``'s, keeping the states the probe may read
(:func:`~esi_guard.combined.probe_window`), fits an :class:`~esi_guard.cascade.ESIProbe` on every
scored answer and reports its held-out Spearman and R^2 (nested cross-validation, 95% bootstrap).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer

from esi_guard import __version__
from esi_guard.calibration.calibrate_combined import decode_states
from esi_guard.calibration.cascade_fit import fit_esi_probe, held_out, label_free_band
from esi_guard.calibration.data import dataset_hash, load_questions
from esi_guard.calibration.prompts import run_prompts
from esi_guard.cascade import PROBE_SIGNALS, ESIProbe
from esi_guard.cli import build
from esi_guard.cli._options import (
    BatchSize,
    Cache,
    ChatTemplateOption,
    Data,
    Device,
    Distance,
    DType,
    InterventionName,
    InterventionOption,
    Limit,
    LocalBackend,
    MaxNewTokens,
    Model,
    NVariants,
    PromptFile,
    QuestionField,
    Resamples,
    Runner,
    Seed,
    System,
    Threads,
    TopK,
)
from esi_guard.cli.output import check_writable, console, fail, needs_extra, used_modules
from esi_guard.cli.run.cache import RunHeader, complete_cache, default_cache
from esi_guard.cli.run.score import score_with_progress
from esi_guard.exceptions import ESIGuardError
from esi_guard.result import DEFAULT_MAX_NEW_TOKENS

__all__ = ["distill", "quality"]


def quality(
    estimates: np.ndarray, esi: np.ndarray, resamples: int, seed: int = 0
) -> dict[str, Any]:
    """Spearman and R^2 of held-out estimates against ESI, each with a 95% bootstrap interval."""
    from scipy.stats import spearmanr

    def both(picks: np.ndarray) -> tuple[float, float]:
        e, y = estimates[picks], esi[picks]
        rho = float(spearmanr(e, y)[0])
        r2 = 1.0 - float(np.sum((y - e) ** 2)) / max(float(np.sum((y - y.mean()) ** 2)), 1e-300)
        return rho, r2

    everyone = np.arange(esi.size)
    rho, r2 = both(everyone)
    rng = np.random.default_rng(seed)
    draws = np.array([both(rng.integers(0, esi.size, esi.size)) for _ in range(resamples)])
    low, high = np.nanpercentile(draws, [2.5, 97.5], axis=0)
    return {"n": int(esi.size),
            "spearman": {"value": rho, "low": float(low[0]), "high": float(high[0])},
            "r2": {"value": r2, "low": float(low[1]), "high": float(high[1])}}  # fmt: skip


def distill(
    data: Data,
    out: Annotated[Path, typer.Option(help="Where to write the ESI probe (JSON).")],
    question_field: QuestionField = None,
    limit: Limit = None,
    seed: Seed = None,
    model: Model = "default",
    device: Device = None,
    dtype: DType = None,
    runner: Runner = LocalBackend.auto,
    chat_template: ChatTemplateOption = None,
    threads: Threads = None,
    intervention: InterventionOption = InterventionName.soc,
    n_variants: NVariants = 10,
    top_k: TopK = 100,
    distance: Distance = "hellinger",
    max_new_tokens: MaxNewTokens = DEFAULT_MAX_NEW_TOKENS,
    system: System = None,
    prompt: PromptFile = None,
    coverage: Annotated[
        float, typer.Option(help="The probe's band: this quantile of |ESI - estimate|.")
    ] = 0.98,
    folds: Annotated[int, typer.Option(min=2, help="Cross-validation folds.")] = 5,
    cache: Cache = None,
    batch_size: BatchSize = 8,
    resamples: Resamples = 1000,
) -> None:
    """Distill ESI into a probe on the answer's own states, from unlabelled questions."""
    needs_extra("distill", used_modules(fits=True))
    if not 0.0 < coverage < 1.0:
        fail(f"--coverage must lie strictly between 0 and 1, got {coverage}")
    check_writable(out, "--out")
    try:
        examples = [q for path in data for q in load_questions(
            path, question_field=question_field, limit=limit, seed=seed)]  # fmt: skip
        system, template = run_prompts(examples, system, prompt, None)
    except ESIGuardError as exc:
        fail(str(exc))
    chosen = build.ModelOptions(model, None, "auto", device, runner, chat_template, dtype,
                                threads)  # fmt: skip
    scoring = build.ScoringOptions(intervention.value, n_variants, top_k, distance,
                                   max_new_tokens)  # fmt: skip
    request = {**chosen.request(), **scoring.request(), "hidden_states": True,
               "system_prompt": system, "prompt_template": template}  # fmt: skip
    digest = dataset_hash(examples)
    cache = cache or default_cache(data, request, digest)
    try:
        found = complete_cache(cache, request, digest, len(examples))
        if found is not None:
            header, records = found
            console.print(f"all {len(records)} questions found in {cache}: no model loaded")
        else:
            guard = build.guard(chosen, scoring, hidden=True)
            header = RunHeader.of(guard, digest, system, template, request)
            records = score_with_progress(guard, examples, cache=cache, header=header,
                                          system=system, template=template,
                                          batch_size=batch_size)  # fmt: skip
            console.print(f"per-question results: {cache}")
    except (ESIGuardError, ImportError) as exc:
        fail(str(exc))
    probe = _fit(records, header, coverage, folds, seed or 0, resamples)
    probe.write(out)
    _say(probe)
    console.print(f"wrote {out}")


def _fit(
    records: list[dict[str, Any]], header: RunHeader, coverage: float, folds: int,
    seed: int, resamples: int,
) -> ESIProbe:  # fmt: skip
    """Fit on every scored answer; held-out quality by nested cross-validation."""
    kept = [r for r in records if r["scored"] and r.get("hidden") and r.get("signals")]
    if len(kept) < 4 * folds:
        fail(f"{len(kept)} of {len(records)} questions were scored: too few to distill a probe")
    signals = [r["signals"] for r in kept]
    esi = np.array([float(r["score"]) for r in kept])
    states = [decode_states(r["hidden"]) for r in kept]
    try:
        probe = fit_esi_probe(signals, esi, hidden=states, coverage=coverage, folds=folds,
                              seed=seed)  # fmt: skip
        estimates = held_out(signals, esi, hidden=states, folds=folds, seed=seed)
        free = held_out(signals, esi, features=PROBE_SIGNALS, folds=folds, seed=seed)
    except ESIGuardError as exc:
        fail(str(exc))
    measured = quality(estimates, esi, resamples, seed)
    measured["signals_only"] = quality(free, esi, resamples, seed)
    return probe.model_copy(update={
        "model": header.model, "model_sha256": header.model_sha256,
        "engine": header.engine, "scoring": header.scoring,
        "quality": measured, "held_out_estimates": tuple(map(float, estimates)),
        "held_out_esi": tuple(map(float, esi)),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "esi_guard_version": __version__,
    })  # fmt: skip


def _say(probe: ESIProbe) -> None:
    q = probe.quality
    hidden = probe.hidden
    if hidden is not None:
        console.print(
            f"ESI probe: layer {hidden.layers[0]} (-1: the final norm's output), "
            f"{'+'.join(hidden.positions)}, {hidden.components} PCA components, L2 "
            f"{probe.strength:g}, with the signals {', '.join(probe.features)}"
        )
    for name, key in (("probe", None), ("signals alone", "signals_only")):
        part = q if key is None else q[key]
        rho, r2 = part["spearman"], part["r2"]
        console.print(
            f"{name}, held out ({part['n']} answers): Spearman with ESI {rho['value']:.3f} "
            f"[{rho['low']:.3f}, {rho['high']:.3f}], R^2 {r2['value']:.3f} "
            f"[{r2['low']:.3f}, {r2['high']:.3f}]"
        )
    esi = np.array(probe.held_out_esi)
    for share in (0.5, 0.8, 0.9):
        threshold = float(np.quantile(esi, share))
        band = label_free_band(probe, threshold)
        ran = (np.array(probe.held_out_estimates) >= band.low) & (
            np.array(probe.held_out_estimates) <= band.high
        )
        reason = (band.fitted or {}).get("reason")
        console.print(
            f"a guard accepting {share:.0%} of these answers (threshold {threshold:.4f}): "
            + (reason or f"its cascade runs ESI on {ran.mean():.1%} of them, its decisions "
               "within 2% of full ESI's with probability 0.9")
        )  # fmt: skip
