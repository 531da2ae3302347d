"""LlamaServer's failures: a clear BackendError that says why, and no process left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from esi_guard import BackendError
from integrations.llamacpp.server import LlamaServer, server_command


def test_a_missing_model_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(BackendError, match=r"no GGUF model file at .*nope\.gguf"):
        LlamaServer.start(missing)


def test_a_server_that_dies_reports_its_last_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file")
    started: list[subprocess.Popen[bytes]] = []
    popen = subprocess.Popen

    def recording_popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        process = popen(*args, **kwargs)  # type: ignore[call-overload]
        started.append(process)
        return process  # type: ignore[no-any-return]

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    with pytest.raises(BackendError, match=r"exited with \d+: .+") as caught:
        LlamaServer.start(broken, timeout=120)
    assert "(no output)" not in str(caught.value)
    assert started and started[0].poll() is not None  # nothing left running


def test_the_command_asks_for_every_tokens_logprobs(tmp_path: Path) -> None:
    command = server_command(tmp_path / "m.gguf", port=1234, n_threads=2)
    assert Path(command[1]).name == "ranked.py" and Path(command[1]).is_file()
    as_it_is = server_command(tmp_path / "m.gguf", port=1234, ranked=False)
    assert as_it_is[1:3] == ["-m", "llama_cpp.server"] and as_it_is[3:] == command[2:-2]
    assert command[command.index("--logits_all") + 1] == "true"
    assert command[command.index("--port") + 1] == "1234"
    assert command[command.index("--n_threads") + 1] == "2"
