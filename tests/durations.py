"""The time a test run took, kept: its ten slowest tests and its whole time beside the goal.

``make test`` writes its run's JUnit XML (``--junitxml``, one ``testcase`` per test with
its setup, call and teardown seconds; the ``testsuite``'s time is the run's wall time)
and ends with::

    python -m tests.durations .venv/test-times/tests.xml

which prints the ten slowest tests of the files (several files: their runs' times added)
and the total against :data:`GOAL` (``make test`` in 15 minutes on two cores), with the
CPU it ran on, so growth shows in the CI log the day it happens. It only prints: a slow
machine is not a failure.
"""

from __future__ import annotations

import argparse
import os
import platform
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

__all__ = ["GOAL", "Timed", "cpu_name", "main", "read", "report"]

GOAL = 15 * 60.0
"""Seconds ``make test`` may take after its install: every test (issue 63)."""


@dataclass(frozen=True)
class Timed:
    """One test and its seconds (setup, call and teardown: a module fixture's time is in
    the first test that used it)."""

    name: str
    seconds: float


def read(path: Path) -> tuple[float, list[Timed]]:
    """A JUnit XML file's wall time (its suites' sum) and its tests, as pytest wrote them."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    wall = sum(float(suite.get("time", 0)) for suite in suites)
    tests = [
        Timed(_name(case), float(case.get("time", 0)))
        for suite in suites
        for case in suite.iter("testcase")
    ]
    return wall, tests


def _name(case: ET.Element) -> str:
    """``tests/x/test_y.py::test_z[param]`` from a ``testcase``'s class and name (an
    ``xdist_group``'s ``@group`` suffix dropped)."""
    classname, name = case.get("classname", ""), case.get("name", "")
    if name.rfind("@") > name.rfind("]"):
        name = name[: name.rfind("@")]
    parts = classname.split(".")
    module = next((i for i in range(len(parts), 0, -1) if parts[i - 1].startswith("test")), 0)
    path = "/".join(parts[:module]) + ".py" if module else classname
    return "::".join([path, *parts[module:], name])


def cpu_name() -> str:
    """The CPU's model name (``lscpu``'s) and its cores, for the log line."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


def report(files: list[Path], slowest: int = 10, goal: float = GOAL) -> str:
    """The ``slowest`` tests of ``files`` and their total wall time beside ``goal``."""
    walls: list[tuple[str, float]] = []
    tests: list[Timed] = []
    for path in files:
        wall, found = read(path)
        walls.append((path.name, wall))
        tests += found
    lines = [f"the {slowest} slowest tests ({cpu_name()}):"]
    for test in sorted(tests, key=lambda t: -t.seconds)[:slowest]:
        lines.append(f"  {test.seconds:8.1f} s  {test.name}")
    total = sum(wall for _, wall in walls)
    tiers = " + ".join(f"{name} {wall:.0f} s" for name, wall in walls)
    verdict = "within" if total <= goal else f"OVER by {total - goal:.0f} s:"
    lines.append(
        f"test time: {tiers} = {total:.0f} s ({total / 60:.1f} min), {verdict} the goal of "
        f"{goal:.0f} s ({goal / 60:.0f} min)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="JUnit XML files (--junitxml)")
    parser.add_argument("--slowest", type=int, default=10, help="how many tests to list")
    parser.add_argument("--goal", type=float, default=GOAL, help="seconds the files may take")
    args = parser.parse_args(argv)
    present = [path for path in args.files if path.is_file()]
    for path in sorted(set(args.files) - set(present)):
        print(f"{path}: not written (its tier did not run)")
    if present:
        print(report(present, args.slowest, args.goal))


if __name__ == "__main__":
    main()
