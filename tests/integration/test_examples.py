"""Every script in examples/ runs to the end on the embedded model, as a new user runs it.

Each runs as its own process (``python examples/NAME.py``), so an import of a private
module, a stale attribute or a traceback at interpreter exit fails here, as it would
for a user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
EXPECTED = {  # a line each script prints once it has guarded its questions
    "quickstart.py": "questions guarded in",
    "bring_your_model.py": "ChatOpenAI, live:",
    "agent_middleware.py": "decision=",
    "api_backend.py": "requests=",
    "rag_selective_answering.py": "decision=",
}


def test_every_example_is_covered() -> None:
    assert {path.name for path in EXAMPLES} == set(EXPECTED)


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda path: path.name)
def test_example_runs(script: Path, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(
        [sys.executable, "-W", "error::ResourceWarning", str(script)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert EXPECTED[script.name] in done.stdout, done.stdout[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]
