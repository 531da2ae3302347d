r"""``esi-guard serve``: the guard as an OpenAI-compatible server (the ``serve`` extra).

    esi-guard serve --model default --action abstain                 # the embedded model
    esi-guard serve --upstream http://vllm:8000/v1 --upstream-model Qwen/Qwen2.5-7B-Instruct \
        --threshold threshold.json --port 8001

The model runs in process (``--model``, ``--backend``) or on an upstream OpenAI-compatible
server (``--upstream``, through the API backend). FastAPI and uvicorn are imported when the
command runs, so the other commands never need them.
"""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict

from esi_guard.cli import build
from esi_guard.cli._options import (
    ChatTemplateOption,
    Device,
    DType,
    LocalBackend,
    Model,
    Runner,
    Threads,
)
from esi_guard.cli.output import fail
from esi_guard.exceptions import ConfigurationError, ESIGuardError

if TYPE_CHECKING:
    from esi_guard.backends import Backend
    from esi_guard.guard import ESIGuard
    from esi_guard.server import ServeSettings

__all__ = ["GuardOptions", "build_guard", "serve"]

KEY_VARIABLE = "ESI_GUARD_API_KEY"
"""The environment variable ``--api-key`` falls back to (keeps the key off the command line)."""


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
    **settings: Any,
) -> ESIGuard:
    """The served guard: a calibration file through ``from_calibration``, or a number."""
    from esi_guard.guard import ESIGuard

    given = {k: v for k, v in settings.items() if v is not None}
    common = {"action": action, "on_error": on_error, "fallback": fallback, **given}
    if threshold is not None and Path(threshold).is_file():
        return ESIGuard.from_calibration(threshold, backend=backend, **common)
    if threshold is None:
        return ESIGuard(backend=backend, **common)
    if _names_a_file(threshold):
        what = "is not a file" if Path(threshold).exists() else "not found"
        msg = f"--threshold {threshold}: calibration file {what}"
        raise ConfigurationError(msg)
    try:
        value = float(threshold)
    except ValueError:
        msg = f"--threshold must be a calibration file or a number, got {threshold!r}"
        raise ConfigurationError(msg) from None
    return ESIGuard(backend=backend, threshold=value, **common)


def _names_a_file(threshold: str) -> bool:
    """Whether ``--threshold`` looks like a path (``.json``, or a folder in it), not a number."""
    return threshold.lower().endswith(".json") or any(s in threshold for s in ("/", os.sep))


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


def _engine(
    model: str, backend: LocalBackend, device: str | None, dtype: str | None,
    chat_template: str | None, upstream: str | None, upstream_model: str | None,
    upstream_mode: str, threads: int | None = None,
) -> Backend:  # fmt: skip
    """The model in process, or the upstream server through the API backend."""
    if upstream is None or upstream_model is None:
        chosen = build.ModelOptions(model, None, "auto", device, backend, chat_template, dtype,
                                    threads)  # fmt: skip
        return build.backend(chosen)
    from esi_guard.backends.openai import OpenAIBackend

    template = build.template_text(chat_template)
    return OpenAIBackend(upstream_model, base_url=upstream, mode=upstream_mode,  # type: ignore[arg-type]
                         chat_template=template, max_concurrency=64)  # fmt: skip


class GuardOptions(BaseModel):
    """The served guard as ``esi-guard serve``'s flags give it, built where it runs.

    Picklable and validated: with ``--ray`` each Ray Serve replica builds its own guard
    from it (:mod:`esi_guard.ray`), and ``esi_guard.ray:app_builder`` reads it from a Serve
    config's ``args``. Paths in it (a threshold file, a chat template) are read where the
    guard is built: on a cluster, on each replica's node.
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
        elif self.action is ServeAction.route and not self.fallback_upstream:
            msg = "--action route needs --fallback-upstream URL"
        if msg is not None:
            raise ConfigurationError(msg)

    def build(self) -> ESIGuard:
        """The guard: its engine loaded (or the upstream's client made), its threshold read."""
        self.check()
        engine = _engine(self.model, self.backend, self.device, self.dtype, self.chat_template,
                         self.upstream, self.upstream_model, self.upstream_mode,
                         self.threads)  # fmt: skip
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
        """The server's settings for this guard (``values``: the server's flags)."""
        from esi_guard.server import ServeSettings

        in_process = self.upstream is None
        aliases = (self.model,) if in_process and values.get("model_name") is None else ()
        if values.get("slots") is None:
            values["slots"] = 1 if in_process else 4
        return ServeSettings(model_aliases=aliases,
                             threshold_source=_threshold_source(self.threshold),
                             **values)  # fmt: skip


def serve(
    model: Model = "default",
    backend: Runner = LocalBackend.auto,
    device: Device = None,
    dtype: DType = None,
    chat_template: ChatTemplateOption = None,
    threads: Threads = None,
    upstream: Annotated[
        str | None, typer.Option(help="An OpenAI-compatible server's /v1 URL to guard.")
    ] = None,
    upstream_model: Annotated[
        str | None, typer.Option(help="The model name the upstream serves.")
    ] = None,
    upstream_mode: Annotated[
        str, typer.Option(help="API backend mode: echo, chat, auto.")
    ] = "auto",
    threshold: Annotated[
        str | None,
        typer.Option(
            help="A calibration file (esi-guard calibrate) or a number; the embedded "
            "model's shipped one when left out."
        ),
    ] = None,
    action: Annotated[ServeAction, typer.Option(help="Untrusted answers.")] = ServeAction.flag,
    on_error: Annotated[
        ServeOnError, typer.Option(help="Answers that cannot be scored.")
    ] = ServeOnError.abstain,
    abstain_message: Annotated[str | None, typer.Option(help="The abstention text.")] = None,
    fallback_upstream: Annotated[
        str | None, typer.Option(help="--action route: the /v1 URL answering instead.")
    ] = None,
    fallback_model: Annotated[
        str | None, typer.Option(help="--action route: the fallback's model name.")
    ] = None,
    n_variants: Annotated[int | None, typer.Option(help="L, variants per question.")] = None,
    top_k: Annotated[int | None, typer.Option(help="k, tokens kept per distribution.")] = None,
    max_tokens: Annotated[
        int | None, typer.Option(help="Most tokens per answer; a request may ask for fewer.")
    ] = None,
    served_model_name: Annotated[
        str | None, typer.Option(help="The name clients send; default the model's id.")
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            help=f"Require Authorization: Bearer KEY (or set {KEY_VARIABLE}).", show_default=False
        ),
    ] = None,
    max_batch: Annotated[int, typer.Option(help="Most requests per batched call (1: off).")] = 32,
    batch_window_ms: Annotated[
        float, typer.Option(help="How long a batch waits for more requests.")
    ] = 10.0,
    max_queue: Annotated[int, typer.Option(help="Most waiting requests; then 503.")] = 256,
    slots: Annotated[
        int | None,
        typer.Option(help="Batched calls at once (default 1 in process, 4 upstream)."),
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(help="Larger bodies get a 413.")] = 1_048_576,
    drain_seconds: Annotated[
        int, typer.Option(help="On SIGTERM, how long in-flight requests may finish.")
    ] = 30,
    log_prompts: Annotated[bool, typer.Option(help="Log prompts and answers.")] = False,
    ray: Annotated[
        bool,
        typer.Option(
            "--ray",
            help="Serve on Ray Serve: the guard in --replicas replica "
            "processes behind one front (the ray extra).",
        ),
    ] = False,
    replicas: Annotated[int, typer.Option(help="--ray: replicas, one guard each.")] = 1,
    max_replicas: Annotated[
        int | None,
        typer.Option(help="--ray: autoscale from --replicas up to this many by load."),
    ] = None,
    replica_cpus: Annotated[
        float, typer.Option(help="--ray: CPUs each replica holds (and its threads).")
    ] = 1.0,
    ray_address: Annotated[
        str | None,
        typer.Option(
            help="--ray: a running Ray cluster (ray://... or auto; default "
            "RAY_ADDRESS, else a local one started here)."
        ),
    ] = None,
) -> None:
    """Serve the guard as an OpenAI-compatible /v1/chat/completions endpoint."""
    try:
        from esi_guard.server import create_app, run
    except ImportError as exc:
        fail(f"esi-guard serve needs the serve extra: pip install 'esi-guard[serve]' ({exc})")
    key = api_key or os.environ.get(KEY_VARIABLE) or None
    try:
        options = GuardOptions(
            model=model, backend=backend, device=device, dtype=dtype,
            chat_template=chat_template, threads=threads, upstream=upstream,
            upstream_model=upstream_model, upstream_mode=upstream_mode, threshold=threshold,
            action=action, on_error=on_error, abstain_message=abstain_message,
            fallback_upstream=fallback_upstream, fallback_model=fallback_model,
            n_variants=n_variants, top_k=top_k, max_tokens=max_tokens,
        )  # fmt: skip
        options.check()
        settings = options.settings(
            model_name=served_model_name, max_batch=max_batch, batch_window_ms=batch_window_ms,
            max_queue=max_queue, slots=slots, api_key=key, max_body_bytes=max_body_bytes,
            log_prompts=log_prompts,
        )  # fmt: skip
        if ray:
            _on_ray(options, settings, host=host, port=port, replicas=replicas,
                    max_replicas=max_replicas, replica_cpus=replica_cpus,
                    address=ray_address)  # fmt: skip
            return
        server_app = create_app(options.build(), settings)
    except (ESIGuardError, ImportError) as exc:
        fail(str(exc))
    run(server_app, host=host, port=port, drain_seconds=drain_seconds)


def _on_ray(
    options: GuardOptions, settings: ServeSettings, *, host: str, port: int, replicas: int,
    max_replicas: int | None, replica_cpus: float, address: str | None,
) -> None:  # fmt: skip
    """``--ray``: the guard in Ray Serve replicas behind one front, until Ctrl-C/SIGTERM."""
    try:
        from esi_guard.ray import run_on_ray
    except ImportError as exc:
        fail(f"esi-guard serve --ray needs the ray extra: pip install 'esi-guard[ray]' ({exc})")
    if options.upstream is None and options.threads is None:
        # llama.cpp's threads spin: one replica's threads on its own CPUs only
        options = options.model_copy(update={"threads": max(1, int(replica_cpus))})
    run_on_ray(options.build, settings, host=host, port=port, replicas=replicas,
               max_replicas=max_replicas, replica_cpus=replica_cpus,
               address=address)  # fmt: skip
