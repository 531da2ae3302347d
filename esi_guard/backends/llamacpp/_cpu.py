"""The CPU llama.cpp runs on and the CPU it was built for: what is safe to load.

Two llama.cpp crashes Python cannot catch. A build with AMX kernels (``AMX_INT8 = 1`` in its system
info) repacks quantized weights at load, and the first decode can segfault
(ggml-org/llama.cpp#20824): :mod:`._loading` turns repacking off there. A ``-march=native`` wheel
carried to a CPU lacking one of its instruction sets dies with ``Illegal instruction``:
:func:`missing_features` sees it first. The project's build (``make demo``) names this CPU's
instruction sets one by one, never AMX, and keys its wheel by them. Run as a script (standard
library only, for the Makefile), this prints that build's ``cmake-args`` or ``key``::

    python esi_guard/backends/llamacpp/_cpu.py cmake-args|key
"""

from __future__ import annotations

import platform
import re
import sys
from pathlib import Path

__all__ = [
    "FEATURES",
    "REBUILD",
    "amx_kernels",
    "build_key",
    "cmake_args",
    "cpu_flags",
    "cpu_name",
    "crash_line",
    "missing_features",
    "system_features",
]

FEATURES: tuple[tuple[str | None, str, tuple[str, ...]], ...] = (
    # (ggml CMake option, name in llama.cpp's system info, /proc/cpuinfo flags it needs)
    (None, "SSE3", ("pni",)),
    (None, "SSSE3", ("ssse3",)),
    ("GGML_SSE42", "SSE42", ("sse4_2",)),
    ("GGML_AVX", "AVX", ("avx",)),
    ("GGML_F16C", "F16C", ("f16c",)),
    ("GGML_FMA", "FMA", ("fma",)),
    ("GGML_AVX2", "AVX2", ("avx2",)),
    ("GGML_BMI2", "BMI2", ("bmi2",)),
    ("GGML_AVX_VNNI", "AVX_VNNI", ("avx_vnni",)),
    ("GGML_AVX512", "AVX512", ("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw")),
    ("GGML_AVX512_VBMI", "AVX512_VBMI", ("avx512vbmi",)),
    ("GGML_AVX512_VNNI", "AVX512_VNNI", ("avx512_vnni",)),
    ("GGML_AVX512_BF16", "AVX512_BF16", ("avx512_bf16",)),
    (None, "AMX_INT8", ("amx_int8", "amx_tile")),
)
"""The x86-64 instruction sets llama.cpp's CPU kernels use; AMX has no CMake option: never on."""

REBUILD = (
    'CMAKE_ARGS="$(esi-guard env --cmake-args)" '
    "pip install --force-reinstall --no-cache-dir llama-cpp-python"
)
"""The command that builds llama-cpp-python for this CPU, AMX left out (said by every error)."""

AMX = "AMX_INT8"
"""llama.cpp's system-info name for its AMX kernels (compiled in or not)."""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str] | None:
    """The CPU's feature flags from ``/proc/cpuinfo`` (``cpuinfo``: its text), None elsewhere."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    match = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return frozenset(match.group(1).split()) if match else None


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name (``/proc/cpuinfo``), or what :mod:`platform` knows."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    match = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or platform.machine())


def system_features(system_info: str | bytes) -> dict[str, str]:
    """``llama_print_system_info()`` as ``{name: value}`` (``"AVX2": "1"``, ...)."""
    text = system_info.decode() if isinstance(system_info, bytes) else system_info
    return {
        name.strip(): value.strip()
        for name, value in re.findall(r"([A-Z][A-Z0-9_]*)\s*=\s*([^|\s]+)", text)
    }


def amx_kernels(features: dict[str, str]) -> bool:
    """Whether llama.cpp was built with its AMX kernels (which repacking would use)."""
    return features.get(AMX) == "1"


def missing_features(features: dict[str, str], flags: frozenset[str] | None) -> list[str]:
    """The instruction sets llama.cpp was built for that this CPU lacks (none if unknown)."""
    if flags is None:
        return []
    return [
        name
        for _, name, needs in FEATURES
        if features.get(name) == "1" and not all(flag in flags for flag in needs)
    ]


def _x86(flags: frozenset[str] | None) -> bool:
    machine = platform.machine().lower()
    return flags is not None and machine in ("x86_64", "amd64")


def cmake_args(flags: frozenset[str] | None = None) -> str:
    """``CMAKE_ARGS`` for this CPU's instruction sets, AMX left out (off x86-64 Linux: none)."""
    flags = cpu_flags() if flags is None else flags
    if not _x86(flags):
        return ""
    assert flags is not None
    args = ["-DGGML_NATIVE=OFF"]
    for option, _, needs in FEATURES:
        if option is not None:
            state = "ON" if all(flag in flags for flag in needs) else "OFF"
            args.append(f"-D{option}={state}")
    return " ".join(args)


def build_key(flags: frozenset[str] | None = None) -> str:
    """The instruction sets :func:`cmake_args` builds for; its wheel runs on CPUs with this key."""
    flags = cpu_flags() if flags is None else flags
    if not _x86(flags):
        return f"native-{platform.machine().lower() or 'unknown'}"
    assert flags is not None
    used = [
        name.lower()
        for option, name, needs in FEATURES
        if option is not None and all(flag in flags for flag in needs)
    ]
    return "x86_64-" + "-".join(used) if used else "x86_64"


def crash_line(
    how: str, features: dict[str, str], flags: frozenset[str] | None, *, repacking: bool
) -> str:
    """One line saying why a llama.cpp decode died (``how``: the signal) and what to do."""
    missing = missing_features(features, flags)
    if missing:
        return (
            f"llama.cpp died with {how}: it was built for {', '.join(missing)}, which this CPU "
            "lacks (a wheel built on another machine); rebuild it here: "
            f"make llamacpp-rebuild, or {REBUILD}"
        )
    if amx_kernels(features):
        where = "with weight repacking on" if repacking else "even with weight repacking off"
        return (
            f"llama.cpp died with {how}: it was built with AMX kernels (AMX_INT8 = 1), which "
            f"crash on this CPU {where} (ggml-org/llama.cpp#20824); load models with "
            f"esi_guard.backends.load_llama, or rebuild without AMX: {REBUILD}"
        )
    return (
        f"llama.cpp died with {how} on a one-token decode, with no known CPU cause "
        f"(built for {', '.join(n for n, v in features.items() if v == '1') or 'nothing'}); "
        "report it with this command's output"
    )


def main(argv: list[str]) -> int:
    """``cmake-args`` or ``key``: print it (the Makefile's build of llama-cpp-python)."""
    commands = {"cmake-args": cmake_args, "key": build_key}
    if len(argv) != 1 or argv[0] not in commands:
        print(f"usage: {Path(__file__).name} cmake-args|key", file=sys.stderr)
        return 2
    print(commands[argv[0]]())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
