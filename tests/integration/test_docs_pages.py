"""Every page of docs/ runs as shown, in page order, on the embedded model, as a new user runs it.

Per page, in a folder of its own holding a copy of ``docs/examples``: its ``python`` blocks
run in one namespace (doctests compared with what they show, numbers within
``tests.shown_output.TOLERANCE``), its ``bash`` blocks' ``esi-guard`` and ``python``
commands run and must exit 0 (with the options of a ``<!-- run here with ...: reason -->``
mark), and a block marked ``<!-- not run: reason -->`` is skipped
(``tests/page_blocks.py`` has the rules; ``tests/unit/test_docs_blocks.py`` checks that
every block is runnable or marked, without a model).

A page whose snippets call a server (``serve.md``) gets the server its "Run it" section
starts first, run here as a process on a free loopback port; the snippets' address
(``127.0.0.1:8000``, the server's default) is pointed at that port.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.page_blocks import (
    Block,
    blocks,
    commands,
    docs_pages,
    run_command,
    run_doctest,
    run_python,
    unrunnable,
    with_options,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SERVERS = {
    "serve.md": "esi-guard serve --action abstain",
    "ray.md": "esi-guard serve --ray --replicas 2",
}
"""The server a page's snippets call: the first command its "Run it" section shows."""
SHOWN_ADDRESS = "127.0.0.1:8000"
"""Where the pages' snippets find that server (its default address)."""
GROUPS = {"ray.md": "ray"}
"""A page's ``xdist_group``: ray.md starts a local Ray, so it runs on the Ray tests' worker
(one local Ray at a time)."""


def _pages() -> list[Any]:
    """The pages as parameters, each in its group where :data:`GROUPS` names one."""
    return [
        pytest.param(*page.values, id=page.id, marks=[*page.marks, pytest.mark.xdist_group(group)])
        if (group := GROUPS.get(str(page.id)))
        else page
        for page in docs_pages(ROOT)
    ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def _server(command: str, cwd: Path) -> Iterator[int]:
    """The page's server command run on a free loopback port until the page is done."""
    port = _free_port()
    words = shlex.split(command)
    log = cwd / "server.log"
    with log.open("w", encoding="utf-8") as output:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name(words[0])), *words[1:], "--port", str(port)],
            cwd=cwd, stdout=output, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not _ready(port):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(encoding="utf-8")[-3000:]
                pytest.fail(f"{command} did not become ready on port {port}:\n{tail}")
            time.sleep(0.5)
        yield port
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _run(block: Block, where: str, namespace: dict[str, Any], cwd: Path) -> list[str]:
    """Run one block; its failure reports (none when it ran as shown)."""
    if block.language == "bash":
        failures = []
        for command in commands(block.source):
            command = with_options(command, block.run_with)
            done = run_command(command, cwd)
            if done.returncode != 0:
                failures.append(
                    f"{where}: {command}\nexit {done.returncode}\n{done.stderr[-3000:]}"
                )
        return failures
    if block.doctest:
        globs, failures = run_doctest(block, namespace, where, where.split(":")[0])
        namespace.update(globs)
        return failures
    try:
        run_python(block, namespace, where.split(":")[0])
    except Exception:
        return [f"{where}:\n{traceback.format_exc()}"]
    return []


def test_every_page_is_here() -> None:
    pages = {param.values[0].name for param in docs_pages(ROOT)}
    assert {"getting-started.md", "rag.md", "serve.md", "calibration.md"} <= pages


@pytest.mark.parametrize("page", _pages())
def test_page_runs_as_shown(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    text = page.read_text(encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": f"__{page.stem}__"}
    failures: list[str] = []
    with contextlib.ExitStack() as stack:
        if page.name in SERVERS:
            assert SERVERS[page.name] in text, f"{page.name} no longer starts {SERVERS[page.name]}"
            port = stack.enter_context(_server(SERVERS[page.name], tmp_path))
            text = text.replace(SHOWN_ADDRESS, f"127.0.0.1:{port}")
        for block in blocks(text):
            where = f"{page.name}:{block.line}"
            problem = unrunnable(block)
            if problem is not None:
                failures.append(f"{where}: the {block.language} block {problem}\n")
            elif block.language in ("python", "bash") and block.not_run is None:
                failures += _run(block, where, namespace, tmp_path)
    assert not failures, "".join(failures)
