"""The scoring pipeline on its own: no LangChain, one record per prompt, every item decided."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import esi_guard
from esi_guard import BackendError, ESIGuard, ESIResult, FakeBackend, ScoringConfig, SkipOneChar
from esi_guard._pipeline import GuardedPrompt, Item, Pipeline, Rule
from esi_guard._pipeline.steps import Work
from esi_guard.backends import ChatMessage
from esi_guard.exceptions import InterventionError, ScoringError
from esi_guard.guard._assess import raised
from esi_guard.policy import Policy, granularity
from esi_guard.scoring import TopK

SURE = "What is the capital city of France?"
UNSURE = "Which river flows through the ancient city of Timbuktu?"
PACKAGE = Path(esi_guard.__file__).parent


def runtime_imports(module: str) -> set[str]:
    """Modules ``module`` imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""
    path = PACKAGE.joinpath(*module.split(".")[1:])
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    found: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING"
        for child in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_pipeline_imports_no_langchain_even_indirectly() -> None:
    seen: set[str] = set()
    folder = PACKAGE / "_pipeline"
    todo = [f"esi_guard._pipeline.{path.stem}" for path in folder.glob("*.py")]
    todo = [name.removesuffix(".__init__") for name in todo]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for imported in runtime_imports(module):
            assert not imported.startswith("langchain"), f"{module} imports {imported}"
            if imported.startswith("esi_guard.") and imported != "esi_guard.backends":
                todo.append(imported)
    assert "esi_guard.scoring" in seen and "esi_guard.result" in seen


def pipeline(backend: FakeBackend, **changes: object) -> Pipeline:
    intervention = SkipOneChar()
    config = ScoringConfig(
        intervention=intervention.describe(), n_variants=4, top_k=5, distance="hellinger",
        values="logits", approximate=False, seed=0, max_new_tokens=8,
    )  # fmt: skip
    settings: dict[str, Any] = {"action": "flag", "on_error": "abstain", **changes}
    threshold = settings.pop("threshold", 0.05)
    policy = Policy.of(
        threshold, granularity=granularity(settings["action"], settings.get("decide_on", "esi"))
    )
    return Pipeline(backend, intervention, Rule(policy, config, backend.model_id, **settings))


def item(question: str, index: int = 0) -> Item:
    prompt = GuardedPrompt((ChatMessage(role="user", content=question),), question_index=0)
    return Item(prompt, index=index)


def run(flow: Pipeline, items: list[Item]) -> list[ESIResult | BackendError]:
    flow.run(items)
    return [i.outcome for i in items]  # type: ignore[misc]


def test_each_item_is_decided_and_keeps_its_own_answer() -> None:
    backend = FakeBackend({SURE: "Paris", UNSURE: "The Nile"}, sensitivity={UNSURE: 2.0})
    sure, unsure = run(pipeline(backend), [item(SURE), item(UNSURE, 1)])
    assert isinstance(sure, ESIResult) and isinstance(unsure, ESIResult)
    assert (sure.decision, sure.answer, sure.finish_reason) == ("accept", "Paris", "stop")
    assert unsure.decision == "flag" and unsure.score is not None and unsure.score > 0.05
    assert len(unsure.variants) == 4 and len(unsure.token_scores) == 2
    assert backend.calls == [("generate", 2), ("teacher_force", 2)]


def test_a_failed_step_is_that_items_outcome_alone() -> None:
    backend = FakeBackend({SURE: "Paris", UNSURE: "Nile"}, failures={SURE: "generate"})
    failed, ok = run(pipeline(backend), [item(SURE), item(UNSURE, 1)])
    assert isinstance(failed, ESIResult) and failed.reason is not None
    assert failed.reason.startswith("backend_error: ") and failed.decision == "abstain"
    assert isinstance(ok, ESIResult) and ok.scored
    raising = pipeline(backend, on_error="raise")
    (error,) = run(raising, [item(SURE)])
    assert isinstance(error, BackendError) and raised(error) is error


def test_an_intervention_that_raises_is_an_intervention_error_per_item() -> None:
    class Broken(SkipOneChar):
        def batch_variants(self, questions, n, *, seed=0):  # type: ignore[no-untyped-def]
            raise RuntimeError("paraphraser down")

    flow = pipeline(FakeBackend({SURE: "Paris"}))
    flow = Pipeline(flow.backend, Broken(), replace(flow.rule, on_error="raise"))
    items = [item(SURE), item(UNSURE, 1)]
    live = flow.generated(items, flow.do(Work("generate", items)))
    errors = flow.do(Work("intervene", live))
    assert all(isinstance(e, InterventionError) for e in errors)
    assert str(errors[0]) == "intervention failed: RuntimeError: paraphraser down"


def test_unscorable_answers_are_decided_before_forcing() -> None:
    backend = FakeBackend(default_answer="")
    (empty,) = run(pipeline(backend), [item(SURE)])
    assert isinstance(empty, ESIResult) and empty.reason is not None
    assert empty.reason.startswith("empty_answer: ")
    (nothing,) = run(pipeline(FakeBackend()), [item("Is 2+2 = 4?")])
    assert isinstance(nothing, ESIResult) and nothing.reason is not None
    assert nothing.reason.startswith("no_effective_variant: ")
    assert ("teacher_force", 0) not in backend.calls and len(backend.calls) == 1
    error = raised(nothing)
    assert isinstance(error, ScoringError) and error.code == "no_effective_variant"
    assert error.result is nothing


def test_changed_keeps_each_distinct_changed_text_once_in_order() -> None:
    one = item(SURE)
    one.variants = ["b", SURE, "a", "b", SURE]
    assert one.changed == ["b", "a"]


@pytest.mark.parametrize("threshold", [0.0, 10.0])
def test_the_decision_follows_the_threshold(threshold: float) -> None:
    backend = FakeBackend({UNSURE: "The Nile"}, sensitivity={UNSURE: 2.0})
    (result,) = run(pipeline(backend, threshold=threshold, action="abstain"), [item(UNSURE)])
    assert isinstance(result, ESIResult)
    assert result.decision == ("abstain" if threshold == 0.0 else "accept")


class ForcingElsewhere(FakeBackend):
    """Generation's numbers differ from forcing's (as llama.cpp's float32 forcing copy).

    With sensitivity 0 a variant's distributions equal the forced original exactly, so
    ESI is 0 against the forced original and above 0 against the generation's. ``forces``:
    the backend returns the forced original unasked, as ``LlamaCppBackend`` then does.
    """

    def __init__(self, *, forces: bool) -> None:
        super().__init__(default_answer="Paris is the capital")
        self.forces = forces

    def generate(self, prompts: Any, **kwargs: Any) -> list[Any]:
        out = super().generate(prompts, **kwargs)
        return [replace(g, topk=TopK(g.topk.ids, g.topk.values * 0.5)) for g in out]

    def teacher_force(self, requests: Any, *, top_k: int) -> list[Any]:
        always = [replace(r, include_original=r.include_original or self.forces) for r in requests]
        return super().teacher_force(always, top_k=top_k)


def test_a_backend_forcing_the_original_is_scored_against_its_forced_original() -> None:
    scores = {}
    for forces in (True, False):
        guard = ESIGuard(backend=ForcingElsewhere(forces=forces), threshold=0.5, n_variants=4,
                         seed=0)  # fmt: skip
        esi = guard.invoke(SURE).response_metadata["esi"]
        assert esi["scored"]
        scores[forces] = esi["score"]
    assert scores[True] == 0.0 and scores[False] > 0.05


def test_the_order_asks_for_work_and_does_none_itself() -> None:
    backend = FakeBackend({SURE: "Paris", UNSURE: "The Nile"})
    flow = pipeline(backend)
    items = [item(SURE), item(UNSURE, 1)]
    steps = flow.steps(items)
    work = next(steps)
    assert (work.step, work.items) == ("generate", items)
    # The first answer failed: it is decided, and only the second is asked for after.
    (_, good) = backend.generate([i.prompt.messages for i in items], max_new_tokens=8, top_k=5)
    work = steps.send([BackendError("engine down"), good])
    assert (work.step, work.items) == ("intervene", items[1:])
    assert isinstance(items[0].outcome, ESIResult) and not items[0].outcome.scored
    work = steps.send([["Which rivr flows?", "Which river flws?"]])
    assert work.step == "score" and len(work.requests) == 1
    assert work.requests[0].answer_ids == list(items[1].answer_ids)
    assert backend.calls == [("generate", 2)]  # the order called nothing
    forced = backend.teacher_force(work.requests, top_k=5)
    with pytest.raises(StopIteration):
        steps.send(forced)
    assert isinstance(items[1].outcome, ESIResult) and items[1].outcome.scored
    assert items[1].outcome.variants == ["Which rivr flows?", "Which river flws?"]


def test_a_stream_scored_by_sentence_asks_for_the_variants_first() -> None:
    flow = pipeline(FakeBackend({SURE: "Paris."}), decide_on="sentences")
    steps = flow.steps([item(SURE)], variants_first=True)
    assert next(steps).step == "intervene"
    assert steps.send([["What is the capitl city of France?"]]).step == "generate"


class DropsAVariant(FakeBackend):
    """Returns one variant fewer than asked: the forced rows cannot score the answer."""

    def teacher_force(self, requests: Any, *, top_k: int) -> list[Any]:
        out = super().teacher_force(requests, top_k=top_k)
        return [replace(f, variants=f.variants[:-1]) for f in out]


def test_rows_that_cannot_score_the_answer_leave_it_unscored_with_the_work_they_cost() -> None:
    (result,) = run(pipeline(DropsAVariant({SURE: "Paris"})), [item(SURE)])
    assert isinstance(result, ESIResult) and not result.scored
    assert result.decision == "abstain" and result.reason is not None
    assert result.reason.startswith("scoring_error: the backend returned 3 variants for 4")
    assert result.work["forced_variants"] == 4 and result.work["forced_tokens"] == 4
