"""The benchmarks' shape: run as modules, no import circle, nothing from the tests."""

from __future__ import annotations

from tests.unit.test_layout import ROOT, circles, import_graph, imports, package_modules

BENCHMARKS = ROOT / "benchmarks"


def test_no_benchmark_module_imports_another_in_a_circle() -> None:
    graph = import_graph(("benchmarks",))
    assert graph["benchmarks.results.run"]  # the graph sees imports at all
    assert circles(graph) == []


def test_benchmarks_take_nothing_from_the_tests() -> None:
    reached = {
        (name, module)
        for name, path in package_modules(("benchmarks",)).items()
        for module, _ in imports(path, name)
        if module.split(".")[0] == "tests"
    }
    assert reached == set()


def test_no_benchmark_edits_sys_path() -> None:
    edits = [p for p in BENCHMARKS.rglob("*.py") if "sys.path" in p.read_text(encoding="utf-8")]
    assert edits == []
