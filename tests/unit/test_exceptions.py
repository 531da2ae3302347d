"""The error tree: one root, typed leaves, and the reason code each class reports."""

from __future__ import annotations

import pytest

import esi_guard
from esi_guard import exceptions
from esi_guard.exceptions import (
    APIContextLengthError,
    APIError,
    BackendError,
    ContextLengthError,
    ESIGuardError,
    InterventionError,
    ScoringError,
    reason,
)


def test_every_error_is_an_esi_guard_error() -> None:
    for name in exceptions.__all__:
        value = getattr(exceptions, name)
        if isinstance(value, type) and not issubclass(value, Warning):
            assert issubclass(value, ESIGuardError), name
    assert issubclass(esi_guard.WholeMessageWarning, UserWarning)  # the one warning class
    assert issubclass(esi_guard.ConfigurationError, ValueError)
    assert issubclass(esi_guard.InputError, ValueError)


def test_the_tree_is_drawn_as_it_is() -> None:
    for name in exceptions.__all__:
        if isinstance(getattr(exceptions, name), type):
            assert name in (exceptions.__doc__ or ""), f"{name} missing from the drawn tree"
    assert issubclass(InterventionError, BackendError)
    assert issubclass(ContextLengthError, BackendError)
    assert issubclass(APIContextLengthError, APIError)
    assert issubclass(APIContextLengthError, ContextLengthError)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (BackendError("x"), "backend_error"),
        (ContextLengthError("x"), "context_overflow"),
        (APIContextLengthError("x", status_code=400), "context_overflow"),
        (InterventionError("x"), "intervention_error"),
        (APIError("x"), "backend_error"),
        (ScoringError("x"), "scoring_error"),
        (ScoringError("x", code="empty_answer"), "empty_answer"),
    ],
)
def test_each_error_reports_its_code(error: ESIGuardError, code: str) -> None:
    assert error.code == code
    assert reason(error) == f"{code}: x"


def test_a_finer_scoring_code_leaves_the_class_alone() -> None:
    ScoringError("x", code="no_effective_variant")
    assert ScoringError("y").code == "scoring_error"
