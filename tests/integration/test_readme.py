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

import doctest
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.shown_output import FLAGS, NumbersWithin

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def readme_steps(text: str) -> list[tuple[str, str]]:
    """The README's runnable blocks in order: ("python", doctest source) or ("bash", line)."""
    steps: list[tuple[str, str]] = []
    for language, body in BLOCK.findall(text):
        if language == "python" and ">>>" in body:
            steps.append(("python", body))
        elif language == "bash":
            command = body.replace("\\\n", " ")
            steps += [
                ("bash", line) for line in command.splitlines() if line.startswith("esi-guard")
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
    parser, namespace = doctest.DocTestParser(), {"__name__": "__readme__"}
    failures: list[str] = []
    for number, (kind, source) in enumerate(
        readme_steps((ROOT / "README.md").read_text(encoding="utf-8")), start=1
    ):
        if kind == "bash":
            executable = Path(sys.executable).with_name(shlex.split(source)[0])
            done = subprocess.run(
                [str(executable), *shlex.split(source)[1:]],
                capture_output=True, text=True, timeout=1200, check=False,
            )  # fmt: skip
            assert done.returncode == 0, f"README step {number}: {source}\n{done.stderr}"
            continue
        test = parser.get_doctest(source, namespace, f"README step {number}", "README.md", 0)
        runner = doctest.DocTestRunner(checker=NumbersWithin(), optionflags=FLAGS)
        runner.run(test, out=failures.append, clear_globs=False)
        namespace = test.globs
    assert not failures, "".join(failures)
