"""``python -m tests.durations``: the slowest tests and the run's time beside the goal."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.durations import main, read

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">
<testsuite name="pytest" tests="3" time="{wall}">
<testcase classname="tests.integration.test_docs_pages" name="test_page_runs_as_shown[ray.md]@ray"
 time="300.5" />
<testcase classname="tests.test_langchain_standard.TestESIGuardIntegration" name="test_invoke"
 time="2.25" />
<testcase classname="tests.unit.server.test_drain" name="test_sigterm[10-True]" time="7.0" />
</testsuite></testsuites>
"""


def test_the_slowest_tests_and_the_whole_time_beside_the_goal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fast.xml").write_text(JUNIT.format(wall=100.0), encoding="utf-8")
    (tmp_path / "model.xml").write_text(JUNIT.format(wall=850.25), encoding="utf-8")
    wall, tests = read(tmp_path / "model.xml")
    assert wall == 850.25
    assert [t.name for t in tests] == [
        "tests/integration/test_docs_pages.py::test_page_runs_as_shown[ray.md]",
        "tests/test_langchain_standard.py::TestESIGuardIntegration::test_invoke",
        "tests/unit/server/test_drain.py::test_sigterm[10-True]",
    ]
    main([str(tmp_path / "fast.xml"), str(tmp_path / "model.xml"), "--slowest", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[0].startswith("the 2 slowest tests (")
    assert lines[1].split() == ["300.5", "s", "tests/integration/test_docs_pages.py"
                                "::test_page_runs_as_shown[ray.md]"]  # fmt: skip
    assert lines[2].split()[0] == "300.5"  # the same test in both files
    assert lines[3] == ("test time: fast.xml 100 s + model.xml 850 s = 950 s (15.8 min), "
                        "OVER by 50 s: the goal of 900 s (15 min)")  # fmt: skip


def test_a_tier_that_did_not_run_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "fast.xml").write_text(JUNIT.format(wall=60), encoding="utf-8")
    main([str(tmp_path / "fast.xml"), str(tmp_path / "model.xml")])
    out = capsys.readouterr().out
    assert f"{tmp_path / 'model.xml'}: not written" in out
    assert out.rstrip().endswith("within the goal of 900 s (15 min)")
