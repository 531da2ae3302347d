"""A Markdown page's code blocks as steps a reader runs: what the README and docs tests share.

A page shows ``python`` and ``bash`` blocks. How each is run:

* a ``python`` block written as a doctest (``>>>``) runs as one, in the page's namespace,
  its shown output compared with :class:`tests.shown_output.NumbersWithin` (text exactly,
  ``...`` matching anything, numbers within ``TOLERANCE``);
* any other ``python`` block runs as a script in the same namespace, for its names (it
  shows no output: a block that shows results is written as a doctest);
* a ``bash`` block's commands (``\\``-continued lines joined, ``#`` comments dropped) run
  in the page's folder, each as its own process from this environment's ``bin``, and must
  exit 0. Only :data:`PROGRAMS` run (``esi-guard``, and ``python``);
* a block that cannot run here (an install, a benchmark that takes hours, a GPU, a remote
  server, a server that must run in another terminal) is marked on the line just above
  it with ``<!-- not run: the reason -->`` and is skipped. :func:`unrunnable` names every
  block of a page that is neither runnable nor marked with a reason;
* a ``bash`` block whose run shows no figure and repeats what a test already checks on
  more inputs may be marked ``<!-- run here with --limit 12: the reason -->``: its
  ``esi-guard`` commands run with those options (:func:`with_options`: each replaces the
  command's own value, or is added), so the page's flags are still run on fewer inputs.

Other blocks (``text``, ``json``, ``yaml``, no language) are prose.
"""

from __future__ import annotations

import doctest
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.shown_output import FLAGS, NumbersWithin

__all__ = [
    "PROGRAMS",
    "Block",
    "blocks",
    "commands",
    "docs_pages",
    "run_command",
    "run_doctest",
    "run_python",
    "unrunnable",
    "with_options",
]

PENDING: dict[str, str] = {}
"""Pages known not to run yet, each with why: expected to fail (strictly: fixed, they fail
here until taken off this list)."""
PROGRAMS = ("esi-guard", "python")
"""The programs a ``bash`` block may run (from this environment's ``bin``)."""
FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```[ \t]*$", re.MULTILINE | re.DOTALL)
MARK = re.compile(r"<!--\s*not run\s*(?::(?P<reason>.*?))?-->\s*\Z", re.DOTALL)
RUN_WITH = re.compile(
    r"<!--\s*run here with\s+(?P<options>--[^:]*?)\s*(?::(?P<reason>.*?))?-->\s*\Z", re.DOTALL
)


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    language: str
    """The fence's language (``""`` when none)."""
    source: str
    """The block's text, its fence's indentation removed."""
    line: int
    """The line of the opening fence (1-based)."""
    not_run: str | None
    """The reason of a ``<!-- not run: ... -->`` mark just above it (``""``: a mark without
    one); None when unmarked."""
    run_with: str | None = None
    """The options of a ``<!-- run here with OPTIONS: reason -->`` mark just above it; None
    when unmarked."""
    run_with_reason: str = ""
    """That mark's reason (``""``: a mark without one)."""

    @property
    def doctest(self) -> bool:
        """A ``python`` block written as a doctest."""
        return self.language == "python" and ">>>" in self.source


def blocks(text: str) -> list[Block]:
    """The page's fenced code blocks, in order."""
    found: list[Block] = []
    for match in FENCE.finditer(text):
        indent, language, body = match.groups()
        before = text[: match.start()].rstrip()
        comment = before[before.rfind("<!--") :] if "<!--" in before else ""
        mark, run_with = MARK.search(comment), RUN_WITH.search(comment)
        found.append(
            Block(
                language=language,
                source=textwrap.dedent(body) if indent else body,
                line=text.count("\n", 0, match.start()) + 1,
                not_run=None if mark is None else (mark.group("reason") or "").strip(),
                run_with=None if run_with is None else run_with.group("options").strip(),
                run_with_reason=(run_with.group("reason") or "").strip() if run_with else "",
            )
        )
    return found


def docs_pages(root: Path) -> list[Any]:
    """``root/docs``'s pages as pytest parameters, :data:`PENDING`'s expected to fail."""
    return [
        pytest.param(
            page,
            id=page.name,
            marks=[pytest.mark.xfail(strict=True, reason=PENDING[page.name])]
            if page.name in PENDING
            else [],
        )
        for page in sorted((root / "docs").glob("*.md"))
    ]


def commands(source: str) -> list[str]:
    """A ``bash`` block's commands: continued lines joined, blank and comment-only lines out."""
    joined = re.sub(r"\s*\\\n\s*", " ", source)
    return [
        line.strip()
        for line in joined.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]


def with_options(command: str, options: str | None) -> str:
    """An ``esi-guard`` command with ``options`` (``--name value`` pairs): each replaces the
    command's own value of that option, or is added at the end. Other commands, as given."""
    words = shlex.split(command, comments=True)
    if options is None or not words or words[0] != "esi-guard":
        return command
    given = shlex.split(options)
    for name, value in zip(given[::2], given[1::2], strict=True):
        if name in words[:-1]:
            words[words.index(name) + 1] = value
        else:
            words += [name, value]
    return shlex.join(words)


def unrunnable(block: Block) -> str | None:
    """Why a ``python`` or ``bash`` block can neither run nor be skipped; None when it can."""
    if block.language not in ("python", "bash"):
        return None
    if block.not_run is not None:
        return None if block.not_run else "is marked not run without a reason"
    if block.run_with is not None and (block.language != "bash" or not block.run_with_reason):
        return f"is marked run here with {block.run_with!r}: a bash block's mark, with the reason"
    if block.language == "bash":
        others = [c for c in commands(block.source) if c.split(maxsplit=1)[0] not in PROGRAMS]
        if others:
            return f"runs {others[0]!r}, not one of {PROGRAMS}: mark it not run, with the reason"
        return None
    try:
        if block.doctest:
            for example in doctest.DocTestParser().get_examples(block.source):
                compile(example.source, "<block>", "single")
        else:
            compile(block.source, "<block>", "exec")
    except (SyntaxError, ValueError) as exc:
        return f"is not Python ({exc})"
    return None


def run_command(command: str, cwd: Path, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    """One shell command of a page, its program taken from this environment's ``bin``."""
    words = shlex.split(command, comments=True)
    program = sys.executable if words[0] == "python" else Path(sys.executable).with_name(words[0])
    return subprocess.run(
        [str(program), *words[1:]],
        capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False,
    )  # fmt: skip


def run_doctest(
    block: Block, namespace: dict[str, Any], name: str, filename: str
) -> tuple[dict[str, Any], list[str]]:
    """Run a doctest block in ``namespace``: the namespace it leaves and its failure reports."""
    failures: list[str] = []
    test = doctest.DocTestParser().get_doctest(block.source, namespace, name, filename, block.line)
    runner = doctest.DocTestRunner(checker=NumbersWithin(), optionflags=FLAGS)
    runner.run(test, out=failures.append, clear_globs=False)
    return test.globs, failures


def run_python(block: Block, namespace: dict[str, Any], filename: str) -> None:
    """Run a plain ``python`` block as a script in ``namespace`` (its errors raise)."""
    code = compile("\n" * block.line + block.source, filename, "exec")
    exec(code, namespace)
