"""The benchmarks' shape: run as modules, no import circle, nothing from the tests."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_layout import ROOT, circles, imports

BENCHMARKS = ROOT / "benchmarks"


def modules() -> dict[str, Path]:
    """Every benchmark module by dotted name (a package by its ``__init__``)."""
    out = {}
    for path in BENCHMARKS.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def test_no_benchmark_module_imports_another_in_a_circle() -> None:
    found = modules()
    graph = {
        name: {
            f"{m}.{i}" if f"{m}.{i}" in found else m
            for m, i in imports(path, name)
            if m in found or f"{m}.{i}" in found
        }
        - {name}
        for name, path in found.items()
    }
    assert graph["benchmarks.results.run"]  # the graph sees imports at all
    assert circles(graph) == []


def test_benchmarks_take_nothing_from_the_tests() -> None:
    reached = {
        (name, module)
        for name, path in modules().items()
        for module, _ in imports(path, name)
        if module.split(".")[0] == "tests"
    }
    assert reached == set()


def test_no_benchmark_edits_sys_path() -> None:
    edits = [p for p in BENCHMARKS.rglob("*.py") if "sys.path" in p.read_text(encoding="utf-8")]
    assert edits == []
