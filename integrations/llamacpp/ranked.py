"""llama-cpp-python's server, its logprobs ranked by numpy: the same answers, ~3x faster.

For every token it reports logprobs of (each echoed prompt token, each generated one),
llama-cpp-python 0.3's ``Llama`` ranks the whole vocabulary in Python:
``sorted(zip(logprobs, range(len(logprobs))), reverse=True)``, 49,152 tuples for the
embedded model, ~90 ms of a CPU per token. Echo requests as the API backend sends them
(12 SciQ questions, ``python -m benchmarks.timing llamacpp-ranked``): 20.8 s -> 6.8 s.
:func:`install` gives the ``llama_cpp.llama`` module a ``zip`` and a ``sorted`` of its own
that do that one ranking with ``np.lexsort`` (~20 ms) and give the same list: the same
``(logprob, index)`` pairs, of the same types, in the same order (ties by the higher index
first, as Python's reversed tuple sort puts them). Every other ``zip`` and ``sorted`` in
that module is the builtin one.

Run as a script, it installs that and runs ``python -m llama_cpp.server`` with the same
arguments: what :func:`integrations.llamacpp.server.server_command` starts.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

__all__ = ["install", "ranked", "scores_zip"]


class _Scores:
    """``zip(scores, range(len(scores)))``: iterates as that zip does, ranks fast."""

    __slots__ = ("scores",)

    def __init__(self, scores: Any) -> None:
        self.scores = scores

    def __iter__(self) -> Iterator[tuple[Any, int]]:
        return builtins.zip(self.scores, range(len(self.scores)), strict=False)


def scores_zip(*iterables: Iterable[Any], strict: bool = False) -> Any:
    """``zip``; for a 1-D score array or list zipped with its indices, a :class:`_Scores`."""
    if len(iterables) == 2 and not strict:
        scores, indices = iterables
        if (
            isinstance(scores, (list, np.ndarray))
            and np.ndim(scores) == 1
            and indices == range(len(scores))
        ):
            return _Scores(scores)
    return builtins.zip(*iterables, strict=strict)


def ranked(iterable: Iterable[Any], /, *, key: Any = None, reverse: bool = False) -> list[Any]:
    """``sorted``; a :class:`_Scores` ranked by numpy into the list ``sorted`` would give."""
    if not isinstance(iterable, _Scores) or key is not None:
        return builtins.sorted(iterable, key=key, reverse=reverse)
    scores = iterable.scores
    values = np.asarray(scores)
    order = np.lexsort((np.arange(len(values)), values))  # by score, then index
    if reverse:
        order = order[::-1]
    # a list's floats stay Python floats; an array's, its numpy scalars (what zip yields)
    chosen = values[order].tolist() if isinstance(scores, list) else values[order]
    return list(builtins.zip(chosen, order.tolist(), strict=False))


def install() -> None:
    """Rank llama-cpp-python's logprobs with numpy (this process, from now on)."""
    import llama_cpp.llama as module

    module.zip = scores_zip  # type: ignore[attr-defined]
    module.sorted = ranked  # type: ignore[attr-defined]


def main(argv: list[str] | None = None) -> None:
    """``python -m llama_cpp.server ARGS``, its ranking installed first."""
    import runpy

    install()
    sys.argv = ["llama_cpp.server", *(sys.argv[1:] if argv is None else argv)]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
