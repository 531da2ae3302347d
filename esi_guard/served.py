"""The guard ``esi-guard serve`` serves, built from its flags where it runs.

It lies below both :mod:`esi_guard.cli.serve` and :mod:`esi_guard.ray` (where each Ray Serve
replica builds its own guard), so neither reaches into the other for it.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from esi_guard.backends._identity import names_a_path
from esi_guard.backends.adapters import LocalBackend, local_backend, read_chat_template
from esi_guard.exceptions import ConfigurationError

if TYPE_CHECKING:
    from esi_guard.backends import Backend
    from esi_guard.guard import ESIGuard
    from esi_guard.server import ServeSettings

__all__ = [
    "GuardOptions",
    "ServeAction",
    "ServeOnError",
    "build_guard",
    "model_backend",
    "served_names",
]


class ServeAction(str, Enum):
    """What the server does with an untrusted answer."""

    flag = "flag"
    abstain = "abstain"
    route = "route"
    redact = "redact"


class ServeOnError(str, Enum):
    """What the server does with an answer it could not score."""

    abstain = "abstain"
    flag = "flag"


def build_guard(
    backend: Backend,
    threshold: str | None,
    *,
    action: str = "flag",
    on_error: str = "abstain",
    fallback: Any = None,
    option: str = "--threshold",
    **settings: Any,
) -> ESIGuard:
    """The served guard, its threshold a calibration file or a number (``option``: its name)."""
    from esi_guard.guard import ESIGuard

    given = {k: v for k, v in settings.items() if v is not None}
    common = {"action": action, "on_error": on_error, "fallback": fallback, **given}
    if threshold is not None and Path(threshold).is_file():
        return ESIGuard.from_calibration(threshold, backend=backend, **common)
    if threshold is None:
        return ESIGuard(backend=backend, **common)
    if _names_a_file(threshold):
        what = "is not a file" if Path(threshold).exists() else "not found"
        msg = f"{option} {threshold}: calibration file {what}"
        raise ConfigurationError(msg)
    try:
        value = float(threshold)
    except ValueError:
        msg = f"{option} must be a calibration file or a number, got {threshold!r}"
        raise ConfigurationError(msg) from None
    return ESIGuard(backend=backend, threshold=value, **common)


def _names_a_file(threshold: str) -> bool:
    """Whether ``--threshold`` looks like a path (``.json``, or a folder in it), not a number."""
    return threshold.lower().endswith(".json") or any(s in threshold for s in ("/", os.sep))


def served_names(model: str) -> tuple[str | None, tuple[str, ...]]:
    """The name a model run here is served under, and the other names clients may send.

    A path is served as its file name less ``.gguf`` and as ``"default"``, never as the path (a 404
    must not show it); any other ``model`` keeps the backend's id (None here) and is taken as given.
    """
    if model == "default" or not (names_a_path(model) or Path(model).expanduser().exists()):
        return None, (model,)
    short = Path(model).name.removesuffix(".gguf")
    return short or "default", ("default",)


def _threshold_source(threshold: str | None) -> str:
    """Where the served threshold comes from, as the start-up log line says it."""
    if threshold is None:
        return "the embedded model's shipped threshold file"
    if Path(threshold).is_file():
        return f"calibration file {threshold}"
    return "--threshold"


def _fallback(url: str, model: str) -> Any:
    """A chat model on the fallback server (its key from ``OPENAI_API_KEY``, as the upstream's)."""
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:
        msg = "--fallback-upstream needs langchain-openai: pip install 'esi-guard[serve]'"
        raise ImportError(msg) from exc
    key = os.environ.get("OPENAI_API_KEY", "EMPTY")
    return ChatOpenAI(base_url=url, model=model, api_key=key, temperature=0)


def model_backend(
    model: str, backend: LocalBackend = LocalBackend.auto, *, device: str | None = None,
    dtype: str | None = None, chat_template: str | None = None, threads: int | None = None,
    upstream: str | None = None, upstream_mode: str = "auto", max_concurrency: int = 8,
) -> Backend:  # fmt: skip
    """What ``calibrate``, ``evaluate``, ``serve`` score with: ``model`` here, or ``upstream``."""
    template = read_chat_template(chat_template)
    if upstream is None:
        engine = None if backend is LocalBackend.auto else backend.value
        return local_backend(model, engine=engine, device=device, n_threads=threads,
                             chat_template=template, dtype=dtype)  # fmt: skip
    from esi_guard.backends.openai import OpenAIBackend

    return OpenAIBackend(model, base_url=upstream, mode=upstream_mode,  # type: ignore[arg-type]
                         chat_template=template, max_concurrency=max_concurrency)  # fmt: skip


class GuardOptions(BaseModel):
    """The served guard as ``esi-guard serve``'s flags give it, built where it runs.

    Picklable and validated: each Ray Serve replica (:mod:`esi_guard.ray`) builds its own guard
    from it (``esi_guard.ray:app_builder`` reads it from a Serve config's ``guard``); its paths (a
    threshold file, a chat template) are read where the guard is built, on each replica's node.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = "default"
    backend: LocalBackend = LocalBackend.auto
    device: str | None = None
    dtype: str | None = None
    chat_template: str | None = None
    threads: int | None = None
    upstream: str | None = None
    upstream_model: str | None = None
    upstream_mode: str = "auto"
    threshold: str | None = None
    action: ServeAction = ServeAction.flag
    on_error: ServeOnError = ServeOnError.abstain
    abstain_message: str | None = None
    fallback_upstream: str | None = None
    fallback_model: str | None = None
    n_variants: int | None = None
    top_k: int | None = None
    max_tokens: int | None = None

    def check(self) -> None:
        """The flags' own conflicts, before anything loads.

        Raises:
            ConfigurationError: naming the flags that conflict.
        """
        msg = None
        if (self.upstream is None) != (self.upstream_model is None):
            msg = "--upstream and --upstream-model go together"
        elif self.threads is not None and self.upstream:
            msg = (f"--threads sets the CPU threads of a model run here; --upstream "
                   f"{self.upstream} runs it")  # fmt: skip
        elif self.upstream and (local := self._local_options()):
            msg = f"{local} is for a model run here; --upstream {self.upstream} runs it"
        elif self.action is ServeAction.route and not self.fallback_upstream:
            msg = "--action route needs --fallback-upstream URL"
        elif self.fallback_upstream and self.action is not ServeAction.route:
            msg = ("--fallback-upstream answers the requests --action route routes; with "
                   f"--action {self.action.value} it is never asked")  # fmt: skip
        elif self.fallback_model is not None and not self.fallback_upstream:
            msg = "--fallback-model names the model of --fallback-upstream URL: give both"
        if msg is not None:
            raise ConfigurationError(msg)

    def _local_options(self) -> str | None:
        """The first flag given that only a model run here takes (None: none)."""
        for given, name in ((self.dtype is not None, "--dtype"),
                            (self.device is not None, "--device"),
                            (self.backend is not LocalBackend.auto, "--backend")):  # fmt: skip
            if given:
                return name
        return None

    def on_cpus(self, cpus: float) -> GuardOptions:
        """These options for a replica of ``cpus`` CPUs: a local model's threads default to them."""
        if self.upstream is None and self.threads is None:
            return self.model_copy(update={"threads": max(1, int(cpus))})
        return self

    def build(self) -> ESIGuard:
        """The guard: its engine loaded (or the upstream's client made), its threshold read."""
        self.check()
        engine = model_backend(
            self.upstream_model or self.model, self.backend, device=self.device,
            dtype=self.dtype, chat_template=self.chat_template, threads=self.threads,
            upstream=self.upstream, upstream_mode=self.upstream_mode, max_concurrency=64,
        )  # fmt: skip
        fallback = None
        if self.fallback_upstream:
            name = self.fallback_model or self.upstream_model or self.model
            fallback = _fallback(self.fallback_upstream, name)
        return build_guard(
            engine, self.threshold, action=self.action.value, on_error=self.on_error.value,
            fallback=fallback, n_variants=self.n_variants, top_k=self.top_k,
            max_new_tokens=self.max_tokens, abstain_message=self.abstain_message,
        )  # fmt: skip

    def settings(self, **values: Any) -> ServeSettings:
        """The server's settings (``values``: its flags), named by :func:`served_names` if local."""
        from esi_guard.server import ServeSettings

        in_process = self.upstream is None
        aliases: tuple[str, ...] = ()
        if in_process and values.get("model_name") is None:
            values["model_name"], aliases = served_names(self.model)
        if values.get("slots") is None:
            values["slots"] = 1 if in_process else 4
        return ServeSettings(model_aliases=aliases,
                             threshold_source=_threshold_source(self.threshold),
                             **values)  # fmt: skip
