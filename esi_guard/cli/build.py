"""What the commands build from their options: the backend, the guard, the labeller."""

from __future__ import annotations

import hashlib
import importlib
from dataclasses import dataclass
from typing import Any

import typer

from esi_guard.backends.adapters import auto_engine, read_chat_template
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import FINAL, HiddenSpec
from esi_guard.calibration import labels as label_methods
from esi_guard.cli._options import LabelMethod, LocalBackend
from esi_guard.cli.output import fail
from esi_guard.combined import probe_window
from esi_guard.exceptions import ConfigurationError
from esi_guard.guard import ESIGuard
from esi_guard.interventions import SkipOneChar, Typo
from esi_guard.served import model_backend

__all__ = [
    "INTERVENTIONS",
    "ModelOptions",
    "ScoringOptions",
    "backend",
    "guard",
    "labeller",
    "local_threads",
    "template_text",
    "worker_cpus",
    "worker_threads",
]

INTERVENTIONS = {"soc": SkipOneChar, "typo": Typo}
"""The interventions ``--intervention`` names."""


@dataclass(frozen=True)
class ModelOptions:
    """The options that choose the model: run here (``--backend``...) or on a server."""

    model: str
    api_base: str | None = None
    api_mode: str = "auto"
    device: str | None = None
    runner: LocalBackend = LocalBackend.auto
    chat_template: str | None = None
    dtype: str | None = None
    threads: int | None = None

    def request(self) -> dict[str, Any]:
        """The options as the cache header records them (no loading)."""
        template = template_text(self.chat_template)
        if template not in (None, "completion"):
            template = "sha256:" + hashlib.sha256(template.encode()).hexdigest()
        if self.api_base:
            return {"model": self.model, "api_base": self.api_base, "api_mode": self.api_mode,
                    "chat_template": template}  # fmt: skip
        engine = self.runner.value
        if self.runner is LocalBackend.auto:
            engine = auto_engine(self.model, device=self.device, dtype=self.dtype)
        return {"model": self.model, "engine": engine, "dtype": self.dtype,
                "chat_template": template}  # fmt: skip


@dataclass(frozen=True)
class ScoringOptions:
    """The options of ESI itself: the intervention, L, k, the distance, the answer's length."""

    intervention: str
    n_variants: int
    top_k: int
    distance: str
    max_new_tokens: int

    def request(self) -> dict[str, Any]:
        """The options as the cache header records them."""
        return {"intervention": INTERVENTIONS[self.intervention]().describe(),
                "n_variants": self.n_variants, "top_k": self.top_k, "distance": self.distance,
                "max_new_tokens": self.max_new_tokens}  # fmt: skip


def backend(options: ModelOptions) -> Backend:
    """The backend the options choose: the server's, or a model loaded here (tests fake it)."""
    try:
        return model_backend(options.model, options.runner, device=options.device,
                             dtype=options.dtype, chat_template=options.chat_template,
                             threads=options.threads, upstream=options.api_base,
                             upstream_mode=options.api_mode)  # fmt: skip
    except ConfigurationError as exc:
        fail(str(exc))


def local_threads(
    threads: int | None, server: str | None, option: str = "--api-base", *,
    dtype: str | None = None, device: str | None = None,
    runner: LocalBackend = LocalBackend.auto,
) -> None:  # fmt: skip
    """End the command if an option for a model run here (``--threads``...) meets a server URL."""
    if not server:
        return
    if threads is not None:
        fail(f"--threads sets the CPU threads of a model run here; {option} {server} runs it")
    for given, name in ((dtype is not None, "--dtype"), (device is not None, "--device"),
                        (runner is not LocalBackend.auto, "--backend")):  # fmt: skip
        if given:
            fail(f"{name} is for a model run here; {option} {server} runs it")


def worker_threads(threads: int | None, workers: int | None, server: str | None) -> int | None:
    """A local model's threads: with ``--workers``, one each unless ``--threads`` (they spin)."""
    if workers and threads is None and not server:
        return 1
    return threads


def worker_cpus(model: ModelOptions) -> float:
    """The CPUs each ``--workers`` actor holds: its model's threads, none for a server's."""
    return 0.0 if model.api_base else float(model.threads or 1)


def template_text(chat_template: str | None) -> str | None:
    """The chat template's source (``completion`` and None as they are)."""
    try:
        return read_chat_template(chat_template)
    except ConfigurationError as exc:
        fail(str(exc))


def labeller(method: LabelMethod, threshold: float | None, judge: str | None) -> Any:
    """The labeller ``--labels`` names."""
    if method is LabelMethod.containment:
        return label_methods.Containment()
    if method is LabelMethod.exact:
        return label_methods.ExactMatch()
    if method is LabelMethod.f1:
        return label_methods.TokenF1(threshold or 0.5)
    if method is LabelMethod.semantic:
        return label_methods.Semantic(threshold or 0.7)
    if not judge or ":" not in judge:
        msg = "--labels judge needs --judge module:attribute"
        raise typer.BadParameter(msg, param_hint="judge")
    module, _, attribute = judge.partition(":")
    try:
        model = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        fail(f"--judge {judge}: cannot import the chat model ({exc})")
    return label_methods.LLMJudge(model)


def guard(model: ModelOptions, scoring: ScoringOptions, *, hidden: bool = False) -> ESIGuard:
    """The guard a run scores with; ``hidden``: it keeps the probe's candidate states."""
    chosen = backend(model)
    states = None
    if hidden:
        if chosen.hidden_layers is None:
            chosen.check_hidden(HiddenSpec((FINAL,)))  # the backend's own refusal
        states = probe_window(chosen.hidden_layers or ())
    return ESIGuard(
        backend=chosen, threshold=0.0, intervention=INTERVENTIONS[scoring.intervention](),
        n_variants=scoring.n_variants, top_k=scoring.top_k, distance=scoring.distance,
        max_new_tokens=scoring.max_new_tokens, seed=0, hidden_states=states,
    )  # fmt: skip
