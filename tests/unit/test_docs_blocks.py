"""Every docs page's code blocks either run or say why not: parsed only, no model.

``tests/integration/test_docs_pages.py`` runs the pages; this finds, in a second, a block
added without a way to run it here (an install line, a command the docs test cannot run)
and without a ``<!-- not run: reason -->`` mark, or a mark without its reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.page_blocks import blocks, commands, docs_pages, unrunnable, with_options

ROOT = Path(__file__).resolve().parents[2]

PAGE = """\
Some prose.

<!-- not run: installs packages -->
```bash
pip install esi-guard
```

<!-- not run -->
```python
x = 1
```

<!-- not run: a mark that prose follows marks nothing -->
Prose.

```bash
esi-guard calibrate --data a.jsonl \\
    --out t.json   # a comment
# a comment line
curl -s http://127.0.0.1:8000/v1/models
```

* a list item:

  ```python
  >>> 1 + 1
  2
  ```

```text
pip install shown, not run
```
"""


@pytest.mark.parametrize("page", docs_pages(ROOT))
def test_every_block_runs_or_says_why_not(page: Path) -> None:
    problems = [
        f"{page.name}:{block.line}: the {block.language} block {problem}"
        for block in blocks(page.read_text(encoding="utf-8"))
        if (problem := unrunnable(block)) is not None
    ]
    assert not problems, "\n".join(problems)


def test_blocks_and_their_marks_are_read() -> None:
    found = blocks(PAGE)
    assert [(b.language, b.line, b.not_run) for b in found] == [
        ("bash", 4, "installs packages"),
        ("python", 9, ""),
        ("bash", 16, None),
        ("python", 25, None),
        ("text", 30, None),
    ]
    assert found[3].source == ">>> 1 + 1\n2\n" and found[3].doctest
    assert commands(found[2].source) == [
        "esi-guard calibrate --data a.jsonl --out t.json   # a comment",
        "curl -s http://127.0.0.1:8000/v1/models",
    ]


def test_what_cannot_run_is_named() -> None:
    found = blocks(PAGE)
    assert unrunnable(found[0]) is None  # marked, with a reason
    assert unrunnable(found[1]) == "is marked not run without a reason"
    assert "'curl -s http://127.0.0.1:8000/v1/models'" in (unrunnable(found[2]) or "")
    assert unrunnable(found[3]) is None
    assert unrunnable(found[4]) is None  # prose
    assert "is not Python" in (unrunnable(blocks("```python\n>>> x = (\n```\n")[0]) or "")


def test_a_run_here_with_mark_runs_the_commands_with_its_options() -> None:
    page = (
        "<!-- run here with --limit 12 --seed 1: the test checks it on 12 -->\n"
        "```bash\nesi-guard calibrate --data a.jsonl --limit 45 --out t.json\n"
        "python -c 'print(1)'\n```\n\n"
        "<!-- run here with --limit 12 -->\n```bash\nesi-guard evaluate\n```\n\n"
        "<!-- run here with --limit 12: only a bash block takes options -->\n"
        "```python\nx = 1\n```\n"
    )
    marked, unexplained, python = blocks(page)
    assert (marked.run_with, marked.run_with_reason) == (
        "--limit 12 --seed 1",
        "the test checks it on 12",
    )
    assert marked.not_run is None and unrunnable(marked) is None
    assert [with_options(c, marked.run_with) for c in commands(marked.source)] == [
        "esi-guard calibrate --data a.jsonl --limit 12 --out t.json --seed 1",
        "python -c 'print(1)'",
    ]
    assert with_options("esi-guard evaluate", None) == "esi-guard evaluate"
    assert "with the reason" in (unrunnable(unexplained) or "")
    assert "with the reason" in (unrunnable(python) or "")
