"""``esi-guard serve``: the flags reach the guard and the server; the extra stays lazy."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import esi_guard.served
import esi_guard.server
from esi_guard import FakeBackend, OpenAIBackend
from esi_guard.cli import app
from esi_guard.served import served_names
from tests.unit.server.servers import QUESTION, user


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `serve` would run: the app and where, with a fake backend for the model."""
    runs: list[dict[str, Any]] = []
    monkeypatch.setattr(esi_guard.served, "local_backend", lambda *a, **k: FakeBackend())
    monkeypatch.setattr(esi_guard.server, "run", lambda a, **kw: runs.append({"app": a, **kw}))
    return runs


def _asking(model: str) -> dict[str, Any]:
    return {"model": model, "messages": user(QUESTION)}


def test_flags_reach_the_guard_and_the_server(launched: list[dict[str, Any]]) -> None:
    result = CliRunner().invoke(app, [
        "serve", "--model", "some.gguf", "--threshold", "0.25", "--action", "abstain",
        "--n-variants", "3", "--max-tokens", "16", "--max-batch", "4", "--batch-window-ms", "5",
        "--max-queue", "9", "--api-key", "k3y", "--port", "8123", "--drain-seconds", "7",
        "--served-model-name", "guarded",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    (run,) = launched
    assert (run["host"], run["port"], run["drain_seconds"]) == ("127.0.0.1", 8123, 7)
    service = run["app"].state.service
    assert service.guard.threshold == 0.25 and service.guard.action == "abstain"
    assert service.guard.n_variants == 3 and service.max_tokens == 16
    assert service.guard.on_error == "abstain" and service.name == "guarded"
    settings = service.settings
    assert (settings.max_batch, settings.batch_window_ms, settings.max_queue) == (4, 5.0, 9)
    assert settings.api_key.get_secret_value() == "k3y" and settings.slots == 1
    assert "k3y" not in repr(settings)


def test_a_threshold_file_goes_through_from_calibration(
    launched: list[dict[str, Any]], tmp_path: Path, threshold_file: Callable[..., Any]
) -> None:
    path = tmp_path / "threshold.json"
    threshold_file(threshold=0.42).write(path)
    result = CliRunner().invoke(app, ["serve", "--threshold", str(path)])
    assert result.exit_code == 0, result.output
    assert launched[0]["app"].state.service.guard.threshold == 0.42
    other = tmp_path / "other.json"
    threshold_file(threshold=0.42, model="another-model").write(other)
    refused = CliRunner().invoke(app, ["serve", "--threshold", str(other)])
    assert refused.exit_code == 2 and "another-model" in refused.output


@pytest.mark.parametrize("given", ["nope.json", "thresholds/nope", "NOPE.JSON"])
def test_a_threshold_file_that_is_not_there_is_said_so_by_name(
    launched: list[dict[str, Any]], given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["serve", "--threshold", given])
    assert result.exit_code == 2 and launched == []
    assert f"--threshold {given}: calibration file not found" in result.output
    (tmp_path / "folder.json").mkdir()
    folder = CliRunner().invoke(app, ["serve", "--threshold", "folder.json"])
    assert folder.exit_code == 2 and "folder.json: calibration file is not a file" in folder.output


def test_the_name_given_to_model_is_accepted_and_where_the_threshold_came_from_is_kept(
    launched: list[dict[str, Any]], tmp_path: Path, threshold_file: Callable[..., Any]
) -> None:
    path = tmp_path / "threshold.json"
    threshold_file(threshold=0.42).write(path)
    for args in (["--model", "default", "--threshold", "0.3"], ["--threshold", str(path)],
                 ["--threshold", "0.3", "--served-model-name", "guarded"],
                 ["--upstream", "http://127.0.0.1:9/v1", "--upstream-model", "served",
                  "--threshold", "0.3"]):  # fmt: skip
        result = CliRunner().invoke(app, ["serve", *args])
        assert result.exit_code == 0, result.output
    given, from_file, renamed, upstream = (run["app"].state.service for run in launched)
    assert given.names == ("fake", "default")  # the served id, then --model as given
    assert given.settings.threshold_source == "--threshold"
    assert from_file.settings.threshold_source == f"calibration file {path}"
    assert renamed.names == ("guarded",) and upstream.names == ("served",)


async def test_a_model_given_by_its_path_is_served_as_its_file_name_and_default_never_the_path(
    launched: list[dict[str, Any]], tmp_path: Path
) -> None:
    gguf = tmp_path / "models" / "my-model.gguf"
    result = CliRunner().invoke(app, ["serve", "--model", str(gguf), "--threshold", "0.3"])
    assert result.exit_code == 0, result.output
    served = launched[0]["app"]
    assert served.state.service.names == ("my-model", "default")
    async with served.router.lifespan_context(served):
        transport = httpx.ASGITransport(app=served)
        async with httpx.AsyncClient(transport=transport, base_url="http://guard") as c:
            models = (await c.get("/v1/models")).json()
            answers = [await c.post("/v1/chat/completions", json=_asking(name))
                       for name in ("default", "my-model", "gpt-4o", str(gguf))]  # fmt: skip
    assert [m["id"] for m in models["data"]] == ["my-model", "default"]
    by_default, by_stem, other, by_path = answers
    assert by_default.status_code == by_stem.status_code == 200, by_default.text
    assert by_default.json()["model"] == by_stem.json()["model"] == "my-model"
    assert other.status_code == by_path.status_code == 404
    assert other.json()["error"] == {
        "message": "The model 'gpt-4o' does not exist: this server serves 'my-model' or 'default'",
        "type": "invalid_request_error", "param": "model", "code": "model_not_found",
    }  # fmt: skip
    assert str(tmp_path) not in json.dumps(models) + by_default.text


@pytest.mark.parametrize(("model", "names"), [
    ("./models/my-model.gguf", ("my-model", ("default",))),
    ("~/weights/Qwen2.5-0.5B-Instruct-Q4_K_M.gguf", ("Qwen2.5-0.5B-Instruct-Q4_K_M", ("default",))),
    ("/srv/models/qwen/", ("qwen", ("default",))),
    ("local-folder", ("local-folder", ("default",))),  # a folder that is there
    ("default", (None, ("default",))),  # the embedded model: its id, and "default"
    ("HuggingFaceTB/SmolLM2-135M-Instruct", (None, ("HuggingFaceTB/SmolLM2-135M-Instruct",))),
])  # fmt: skip
def test_a_path_is_served_by_its_short_name_a_hub_id_as_given(
    model: str, names: tuple[str | None, tuple[str, ...]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local-folder").mkdir()
    assert served_names(model) == names


def test_upstream_mode_guards_the_server_through_the_api_backend(
    launched: list[dict[str, Any]],
) -> None:
    result = CliRunner().invoke(app, [
        "serve", "--upstream", "http://127.0.0.1:9/v1", "--upstream-model", "served-name",
        "--upstream-mode", "chat", "--threshold", "0.3",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    service = launched[0]["app"].state.service
    backend = service.guard.backend.inner
    assert isinstance(backend, OpenAIBackend)
    assert (backend.model, backend.base_url, backend.mode) == (
        "served-name",
        "http://127.0.0.1:9/v1",
        "chat",
    )
    assert service.name == "served-name" and service.settings.slots == 4


@pytest.mark.parametrize(("args", "said"), [
    (["--action", "route"], "--fallback-upstream"),
    (["--upstream", "http://127.0.0.1:9/v1"], "--upstream-model"),
    (["--threshold", "high"], "calibration file or a number"),
])  # fmt: skip
def test_settings_that_cannot_work_are_refused(
    launched: list[dict[str, Any]], args: list[str], said: str
) -> None:
    result = CliRunner().invoke(app, ["serve", "--threshold", "0.3", *args])
    assert result.exit_code == 2
    assert said in result.output
    assert launched == []


def test_the_package_and_the_other_commands_do_not_import_the_server() -> None:
    code = (
        "import sys, esi_guard, esi_guard.cli; "
        "print(sorted({'fastapi', 'uvicorn', 'prometheus_client', 'starlette'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
