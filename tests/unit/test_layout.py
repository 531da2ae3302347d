"""The house's shape, read off the code's own imports (every import, ``TYPE_CHECKING`` too)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import esi_guard

PACKAGE = Path(esi_guard.__file__).parent
ROOT = PACKAGE.parent
USERS = ("benchmarks", "examples", "integrations")
"""Code that uses the package as a user would: public names only."""


def package_modules(folders: tuple[str, ...] = ("esi_guard",)) -> dict[str, Path]:
    """Every module under ``folders`` by dotted name (a package by its ``__init__``)."""
    out = {}
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, name: str = "") -> Iterator[tuple[str, str]]:
    """``(module, imported name)`` of every import in the file (``""`` for ``import x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, "") for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join([*base, *([module] if module else [])])
            yield from ((module, alias.name) for alias in node.names)


def import_graph(folders: tuple[str, ...] = ("esi_guard",)) -> dict[str, set[str]]:
    """Module -> the modules under ``folders`` it imports (``from pkg import mod`` names
    ``pkg.mod``), every import (lazy ones too)."""
    modules = package_modules(folders)
    graph = {}
    for name, path in modules.items():
        found = set()
        for module, imported in imports(path, name):
            if f"{module}.{imported}" in modules:
                found.add(f"{module}.{imported}")
            elif module in modules:
                found.add(module)
        graph[name] = found - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in graph:
        if node not in index:
            visit(node)
    return found


FLOORS = {"esi_guard": 0, "integrations": 1, "examples": 2, "benchmarks": 2, "tests": 3}
"""The checkout's folders from the bottom up: each imports only from its floor or below."""


def test_the_checkout_has_no_import_circle() -> None:
    graph = import_graph(tuple(FLOORS))
    assert graph["benchmarks.results.run"] and graph["tests.server.load"]  # it sees them
    assert circles(graph) == []


def test_no_folder_imports_from_a_floor_above_it() -> None:
    climbs = [
        f"{name} -> {other}"
        for name, others in import_graph(tuple(FLOORS)).items()
        for other in others
        if FLOORS[other.split(".")[0]] > FLOORS[name.split(".")[0]]
    ]
    assert climbs == []


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph()
    assert graph["esi_guard.guard.chat_model"]  # the graph sees imports at all
    assert circles(graph) == []


def test_a_circle_is_found() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("esi_guard._pipeline", "esi_guard.guard"),
        ("esi_guard._pipeline", "langchain"),
        ("esi_guard._pipeline", "langchain_core"),
        ("esi_guard.calibration", "esi_guard.guard"),
        ("esi_guard.calibration", "esi_guard.cli"),
        ("esi_guard.calibration", "langchain"),
        ("esi_guard.calibration", "langchain_core"),
        ("esi_guard.interventions", "langchain_core"),
        ("esi_guard._text", "langchain_core"),
        ("esi_guard.backends", "esi_guard.guard"),
        ("esi_guard.guard._tracing", "esi_guard._pipeline"),
        ("esi_guard.ray", "esi_guard.cli"),
        ("esi_guard.served", "esi_guard.cli"),
        ("esi_guard.served", "esi_guard.ray"),
    ],
)
def test_nothing_below_imports_what_is_above(lower: str, upper: str) -> None:
    for name, path in package_modules().items():
        if name != lower and not name.startswith(f"{lower}."):
            continue
        for module, _ in imports(path, name):
            assert not (module == upper or module.startswith(f"{upper}.")), (name, module)


def private(module: str, imported: str) -> bool:
    """Whether the import reaches into a private module or name of the package."""
    if module.split(".")[0] != "esi_guard":
        return False
    parts = [*module.split("."), *([imported] if imported else [])]
    return any(part.startswith("_") and not part.startswith("__") for part in parts)


def test_benchmarks_examples_and_integrations_import_only_public_names() -> None:
    reached = [
        f"{path.relative_to(ROOT)}: {module} {imported}".strip()
        for folder in USERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for module, imported in imports(path)
        if private(module, imported)
    ]
    assert reached == []


def test_private_means_an_underscore_anywhere_in_the_path() -> None:
    assert private("esi_guard._pipeline", "Pipeline")
    assert private("esi_guard.guard", "_tracing")
    assert private("esi_guard.backends.hf._force", "")
    assert not private("esi_guard", "__version__")
    assert not private("esi_guard.backends", "ForcingRequest")
    assert not private("langchain_core._api", "beta")
