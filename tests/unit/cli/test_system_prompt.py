"""calibrate's prompts: the system prompt is text, sent as written, never intervened on."""

from __future__ import annotations

import pytest

from esi_guard import ESIGuard, ESIResult, SkipOneChar
from tests.unit.test_interventions_unicode import Recording

RAG = "Passage: {context}\nQuestion: {question}"
VALUES = {"context": "Shakespeare wrote Hamlet.", "question": "Who wrote Hamlet?"}


@pytest.mark.parametrize(
    "system", ['Reply as JSON: {"answer": "..."}', "Be brief about {question}", "Use {context}"]
)
def test_calibrate_sends_its_system_prompt_as_written_and_never_intervenes_on_it(
    system: str,
) -> None:
    from esi_guard.cli.run.score import renderer_for

    backend = Recording()
    guard = ESIGuard(backend=backend, threshold=0.5, intervention=SkipOneChar(p=1.0))
    # Before: a KeyError for the JSON braces; "{question}" filled and intervened on.
    (result,) = guard.assess([renderer_for(system, RAG).render(VALUES)])
    assert isinstance(result, ESIResult) and result.scored
    (request,) = backend.requests
    assert request.prompt[0] == {"role": "system", "content": system}
    for rows in request.variants:
        assert rows[0] == {"role": "system", "content": system}
        assert rows[1]["content"].startswith("Passage: Shakespeare wrote Hamlet.\nQuestion: ")
