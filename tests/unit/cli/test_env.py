"""``esi-guard env``: a crash in the child decode is one line naming the cause and the fix."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from esi_guard.cli import app
from esi_guard.cli import env as env_module
from esi_guard.cli.env import decode_check

AMX_INFO = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
    "AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 | REPACK = 1 |"
)
SPR = frozenset(
    [
        "pni",
        "ssse3",
        "sse4_2",
        "avx",
        "f16c",
        "fma",
        "avx2",
        "bmi2",
        "avx512f",
        "avx512cd",
        "avx512vl",
        "avx512dq",
        "avx512bw",
        "avx512_vnni",
        "amx_int8",
        "amx_tile",
    ]
)
AVX2 = frozenset(["pni", "ssse3", "sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"])


def child(head: dict[str, object] | None, then: str) -> list[str]:
    """A stand-in probe: prints ``head`` as the real one does, then runs ``then``."""
    lines = ["import json, os, signal, sys"]
    if head is not None:
        lines.append(f"print(json.dumps({head!r}), flush=True)")
    lines.append(then)
    return [sys.executable, "-c", "\n".join(lines)]


SEGV = "os.kill(os.getpid(), signal.SIGSEGV)"
ILL = "os.kill(os.getpid(), signal.SIGILL)"


def test_a_segfault_on_a_build_with_amx_kernels_names_amx_and_load_llama() -> None:
    head = {"version": "0.3.36", "system_info": AMX_INFO, "repacking_off": False}
    check = decode_check(child(head, SEGV), flags=SPR)
    assert not check.ok
    assert "\n" not in check.line
    assert "SIGSEGV" in check.line and "AMX_INT8 = 1" in check.line
    assert "load_llama" in check.line and "esi-guard env --cmake-args" in check.line
    assert "with weight repacking on" in check.line


def test_an_illegal_instruction_from_a_build_for_another_cpu_names_the_missing_sets() -> None:
    head = {"version": "0.3.36", "system_info": AMX_INFO, "repacking_off": True}
    check = decode_check(child(head, ILL), flags=AVX2)
    assert not check.ok and "\n" not in check.line
    assert "SIGILL" in check.line and "AVX512" in check.line and "lacks" in check.line
    assert "rebuild" in check.line


def test_a_crash_before_llama_cpp_said_anything_is_still_one_line() -> None:
    check = decode_check(child(None, SEGV), flags=AVX2)
    assert not check.ok and "\n" not in check.line
    assert check.line.startswith("importing llama-cpp-python died with SIGSEGV")


def test_a_decode_that_fails_without_crashing_says_why() -> None:
    head = {"version": "0.3.36", "system_info": AMX_INFO, "repacking_off": True}
    error = json.dumps({"error": "model file not found"})
    check = decode_check(child(head, f"print({error!r}); sys.exit(1)"), flags=SPR)
    assert not check.ok and check.line == "failed (exit 1): model file not found"


def test_the_command_reports_the_crash_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    head = {"version": "0.3.36", "system_info": AMX_INFO, "repacking_off": False}
    monkeypatch.setattr(env_module, "PROBE", child(head, SEGV))
    monkeypatch.setattr(env_module, "cpu_flags", lambda: SPR)
    result = CliRunner().invoke(app, ["env"])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert any(line.startswith("esi_guard: ") for line in lines)
    assert "weight repacking: off: llama.cpp has AMX kernels" in result.output
    (decode,) = [line for line in lines if line.startswith("one-token decode")]
    assert "SIGSEGV" in decode and "load_llama" in decode


def test_cmake_args_alone_for_a_pip_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(env_module, "cmake_args", lambda: "-DGGML_NATIVE=OFF -DGGML_AVX2=ON")
    result = CliRunner().invoke(app, ["env", "--cmake-args"])
    assert result.exit_code == 0
    assert result.output == "-DGGML_NATIVE=OFF -DGGML_AVX2=ON\n"
