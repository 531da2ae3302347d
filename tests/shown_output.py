"""Shown outputs compared as a reader would, on any CPU: text exactly, numbers within a tolerance.

llama.cpp's SIMD paths (AVX2, AVX-512, ...) round differently, so a score printed on one CPU
class comes out a little different on another, and so does a threshold calibrated there
(the README's calibrated 0.328 is 0.340 on an Intel AVX-512 machine). The pages' shown
outputs are compared with :class:`NumbersWithin`: every word, decision and answer exactly
(``...`` matching anything, whitespace normalised, as doctest's ELLIPSIS and
NORMALIZE_WHITESPACE do), every number within :data:`TOLERANCE` of the one shown. Real
drift (another decision, another answer, a score that moved by more) still fails.
"""

from __future__ import annotations

import doctest
import re

__all__ = ["FLAGS", "TOLERANCE", "NumbersWithin"]

TOLERANCE = 0.03
"""How far a shown decimal may move between CPU classes (absolute)."""
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
NUMBER = re.compile(r"(?<![\w.])-?\d+\.\d+")
"""A decimal number (integers are counts and must match exactly)."""


class NumbersWithin(doctest.OutputChecker):
    """Doctest's checker, then the same text with each decimal within :data:`TOLERANCE`."""

    def check_output(self, want: str, got: str, optionflags: int) -> bool:
        if super().check_output(want, got, optionflags):
            return True
        wanted, got_numbers = NUMBER.findall(want), NUMBER.findall(got)
        if not wanted or len(wanted) != len(got_numbers):
            return False
        if not super().check_output(NUMBER.sub("#", want), NUMBER.sub("#", got), optionflags):
            return False
        return all(
            abs(float(a) - float(b)) <= TOLERANCE for a, b in zip(wanted, got_numbers, strict=False)
        )
