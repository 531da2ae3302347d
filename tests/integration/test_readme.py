"""The README's steps, in order, on the embedded model: what it shows is what the code prints.

Every ``python`` block written as a doctest (``>>>``) runs in one namespace, in README
order, and its shown output is compared (``...`` matches anything; numbers within
``tests.shown_output.TOLERANCE``, as llama.cpp rounds differently on each CPU class); every
``bash`` block whose lines start with ``esi-guard`` runs as a command in the same folder.
Blocks that are neither (install commands, sketches naming models this machine does not
have) are prose.
This is the new user's first hour: quick start, ``llm=`` with a ``Llama``, calibrate as
written, ``from_calibration(..., llm=the same Llama)``, RAG with the decision kept, live
streaming.
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

import pytest

from tests.page_blocks import Block, blocks, commands, run_command, run_doctest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


def readme_steps(text: str) -> list[tuple[str, Block | str]]:
    """The README's runnable steps in order: ("python", doctest block) or ("bash", command)."""
    steps: list[tuple[str, Block | str]] = []
    for block in blocks(text):
        if block.doctest:
            steps.append(("python", block))
        elif block.language == "bash":
            steps += [
                ("bash", line)
                for line in commands(block.source)
                if shlex.split(line, comments=True)[0] == "esi-guard"
            ]
    return steps


def test_readme_blocks_are_found() -> None:
    steps = readme_steps((ROOT / "README.md").read_text(encoding="utf-8"))
    kinds = [kind for kind, _ in steps]
    assert kinds.count("bash") >= 1 and kinds.count("python") >= 4, kinds


def test_readme_runs_as_shown(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "docs" / "examples", tmp_path / "docs" / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
    namespace: dict[str, object] = {"__name__": "__readme__"}
    failures: list[str] = []
    for number, (_, step) in enumerate(
        readme_steps((ROOT / "README.md").read_text(encoding="utf-8")), start=1
    ):
        if isinstance(step, str):
            done = run_command(step, tmp_path)
            assert done.returncode == 0, f"README step {number}: {step}\n{done.stderr}"
            continue
        namespace, found = run_doctest(step, namespace, f"README step {number}", "README.md")
        failures += found
    assert not failures, "".join(failures)
