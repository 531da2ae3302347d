"""``esi-guard env``: what this machine runs the guard with, for trouble-shooting and bug reports.

Versions, the default engine, the CPU and llama.cpp's build, weight repacking, ``CMAKE_ARGS`` for
this CPU, and a one-token decode in a child process (:mod:`esi_guard.backends.llamacpp._probe`,
which alone imports llama-cpp-python), so a kernel crash becomes one line saying what to do, not a
dead caller. Exits 1 when the decode fails.
"""

from __future__ import annotations

import json
import platform
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Annotated, Any

import typer

from esi_guard import __version__
from esi_guard.backends.llamacpp._cpu import (
    FEATURES,
    amx_kernels,
    build_key,
    cmake_args,
    cpu_flags,
    cpu_name,
    crash_line,
    missing_features,
    system_features,
)

__all__ = ["DecodeCheck", "decode_check", "env"]

PACKAGES = ("llama-cpp-python", "torch", "transformers", "langchain-core")
PROBE = [sys.executable, "-m", "esi_guard.backends.llamacpp._probe"]
"""The child that imports llama-cpp-python and decodes one token."""


@dataclass
class DecodeCheck:
    """What the child decode printed, and how it ended."""

    ok: bool
    line: str
    """One line: the token and its time, or why it failed and what to do."""
    head: dict[str, Any] = field(default_factory=dict)
    """The child's first line: llama-cpp-python's version and system info (empty if none)."""

    @property
    def features(self) -> dict[str, str]:
        """llama.cpp's system info as ``{name: value}`` (empty when the child said nothing)."""
        return system_features(str(self.head.get("system_info", "")))


def decode_check(
    command: Sequence[str] = PROBE, *, timeout: float = 300, flags: frozenset[str] | None = None
) -> DecodeCheck:
    """Run ``command`` (the probe child) and read what it printed, a crash included."""
    flags = cpu_flags() if flags is None else flags
    try:
        done = subprocess.run(
            list(command), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return DecodeCheck(False, f"no answer from the one-token decode in {timeout:g} s")
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    head = lines[0] if lines else {}
    check = DecodeCheck(False, "", head)
    if done.returncode < 0:
        try:
            how = signal.Signals(-done.returncode).name
        except ValueError:
            how = f"signal {-done.returncode}"
        if not head:
            check.line = f"importing llama-cpp-python died with {how}: " + crash_line(
                how, {}, flags, repacking=True
            )
        else:
            check.line = crash_line(
                how, check.features, flags, repacking=not head.get("repacking_off", False)
            )
        return check
    last = lines[-1] if len(lines) > 1 else {}
    if done.returncode == 0 and "text" in last:
        check.ok = True
        check.line = f"ok: {last['text']!r} in {last['seconds']:.2f} s (model load included)"
        return check
    error = last.get("error") or (done.stderr.strip().splitlines() or ["no output"])[-1]
    check.line = f"failed (exit {done.returncode}): {error}"
    return check


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _default_engine() -> str:
    from esi_guard.backends.embedded import EMBEDDED_MODEL_ID, EmbeddedBackend

    return f"{EMBEDDED_MODEL_ID} on {EmbeddedBackend().engine}"


def _repacking(features: dict[str, str]) -> str:
    if not features:
        return "unknown (llama.cpp said nothing)"
    if amx_kernels(features):
        return (
            "off: llama.cpp has AMX kernels (AMX_INT8 = 1), whose repacked weights can crash "
            "the first decode on CPUs with AMX; the guard loads models without repacking"
        )
    return "on (llama.cpp's default; it has no AMX kernels)"


def env(
    cmake: Annotated[
        bool,
        typer.Option(
            "--cmake-args",
            help="Print only the CMAKE_ARGS that build llama-cpp-python for this CPU "
            "(its instruction sets, no AMX), and exit.",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(help="A .gguf file for the one-token decode (default: the embedded model)."),
    ] = None,
) -> None:
    """Show what the guard runs with here, and decode one token in a child process.

    Paste its output into a bug report.
    """
    if cmake:
        print(cmake_args())
        return
    flags = cpu_flags()
    print(f"esi_guard: {__version__}")
    print(f"python: {platform.python_version()} ({platform.platform()})")
    for package in PACKAGES:
        print(f"{package}: {_version(package)}")
    print(f"default guard: {_default_engine()}")
    has = [name for _, name, needs in FEATURES if flags and all(f in flags for f in needs)]
    print(f"cpu: {cpu_name()} ({platform.machine()}); has {' '.join(has) or 'unknown'}")
    check = decode_check([*PROBE, *([model] if model else [])], flags=flags)
    built = [name for name, value in check.features.items() if value == "1"]
    print(f"llama.cpp built for: {' '.join(built) or 'unknown'}")
    missing = missing_features(check.features, flags)
    print(f"llama.cpp built for instructions this CPU lacks: {', '.join(missing) or 'none'}")
    print(f"weight repacking: {_repacking(check.features)}")
    print(f"build for this CPU: {build_key(flags)}")
    print(f'  CMAKE_ARGS="{cmake_args(flags)}"')
    print(f"one-token decode (child process): {check.line}")
    if not check.ok:
        raise typer.Exit(1)
