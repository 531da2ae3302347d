"""The RAG benchmark's scoring of one batch drives the pipeline it builds (fake backend)."""

from __future__ import annotations

import pytest

from benchmarks.common import Clock
from benchmarks.results import rag
from esi_guard import ConfigurationError, FakeBackend
from esi_guard.calibration.data import Example
from esi_guard.guard import Item
from esi_guard.result import ESIResult

EXAMPLE = Example(question="Where is the Eiffel Tower located?", answers=("Paris",),
                  context="The Eiffel Tower stands in Paris, France.")  # fmt: skip


def test_a_rag_batch_generates_intervenes_and_forces_through_the_pipeline() -> None:
    backend = FakeBackend(default_answer="It is in Paris.", default_sensitivity=0.3)
    pipeline = rag._pipeline(backend, 16)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="FakeBackend cannot sample"):  # every ESI step ran
        rag._score_batch(pipeline, backend, [(0, EXAMPLE)], similarity=None)  # type: ignore[arg-type]
    methods = [method for method, _ in backend.calls]
    assert methods == ["generate", "teacher_force", "teacher_force", "teacher_force"]


def test_rag_esi_scores_the_undecided_items() -> None:
    backend = FakeBackend(default_answer="It is in Paris.", default_sensitivity=0.3)
    pipeline = rag._pipeline(backend, 16)  # type: ignore[arg-type]
    items = [Item(rag.templated(EXAMPLE))]
    gens = backend.generate([i.prompt.messages for i in items], max_new_tokens=16, top_k=100)
    pipeline.generated(items, gens)
    rag._esi(pipeline, Clock(), items, "q")
    (outcome,) = [item.outcome for item in items]
    assert isinstance(outcome, ESIResult) and outcome.scored and len(outcome.variants) == 10
