"""``esi-guard serve``: the guard as an OpenAI-compatible server (the ``serve`` extra).

The model runs in process (``--model``) or upstream (``--upstream``, through the API backend); with
``--ray`` in Ray Serve replicas (:mod:`esi_guard.ray`), each building its guard from the same flags
(:class:`~esi_guard.served.GuardOptions`). FastAPI, uvicorn and Ray are imported only when it runs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Annotated

import typer

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
from esi_guard.exceptions import ESIGuardError
from esi_guard.served import GuardOptions, ServeAction, ServeOnError

if TYPE_CHECKING:
    from esi_guard.server import ServeSettings

__all__ = ["serve"]

KEY_VARIABLE = "ESI_GUARD_API_KEY"
"""The environment variable ``--api-key`` falls back to (keeps the key off the command line)."""


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
        str | None,
        typer.Option(
            help="The name clients send; default: a path's file name (no .gguf) or "
            "'default', else the model's id."
        ),
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
    route_prefix: Annotated[
        str, typer.Option(help="--ray: the app's path on Serve's proxy (/v1 under it).")
    ] = "/",
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
                    address=ray_address, route_prefix=route_prefix)  # fmt: skip
            return
        server_app = create_app(options.build(), settings)
    except (ESIGuardError, ImportError) as exc:
        fail(str(exc))
    run(server_app, host=host, port=port, drain_seconds=drain_seconds)


def _on_ray(
    options: GuardOptions, settings: ServeSettings, *, host: str, port: int, replicas: int,
    max_replicas: int | None, replica_cpus: float, address: str | None, route_prefix: str,
) -> None:  # fmt: skip
    """``--ray``: the guard in Ray Serve replicas behind one front, until Ctrl-C/SIGTERM."""
    try:
        from esi_guard.ray import run_on_ray
    except ImportError as exc:
        fail(f"esi-guard serve --ray needs the ray extra: pip install 'esi-guard[ray]' ({exc})")
    options = options.on_cpus(replica_cpus)
    run_on_ray(options.build, settings, host=host, port=port, replicas=replicas,
               max_replicas=max_replicas, replica_cpus=replica_cpus, address=address,
               route_prefix=route_prefix)  # fmt: skip
