"""The guard's steps as child runs: tagged, carrying the caller's config, small outputs."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda

from esi_guard import BackendError, ESIGuard, FakeBackend

SURE = "What is the capital city of France?"
UNSURE = "Which river flows through the ancient city of Timbuktu?"
FALLBACK = RunnableLambda(lambda _: AIMessage(content="Ask a librarian."))


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.runs: dict[UUID, dict[str, Any]] = {}

    def on_chain_start(
        self,
        serialized: Any,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.runs[run_id] = {
            "name": kwargs.get("name"),
            "parent": parent_run_id,
            "tags": tags or [],
            "metadata": metadata or {},
            "inputs": inputs,
        }

    def on_chat_model_start(
        self, serialized: Any, messages: Any, *, run_id: UUID, **kwargs: Any
    ) -> None:
        """The guard's own run: a chat-model run, like any chat model's."""
        self.on_chain_start(serialized, messages, run_id=run_id, **kwargs)
        self.runs[run_id]["kind"] = "chat_model"

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs[run_id]["outputs"] = outputs

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self.runs[run_id]["error"] = error


def make_guard(**kwargs: Any) -> ESIGuard:
    backend = FakeBackend({SURE: "Paris", UNSURE: "The Nile river"}, sensitivity={UNSURE: 2.0})
    return ESIGuard(**{"backend": backend, "threshold": 0.05, **kwargs})


async def call(guard: ESIGuard, mode: str, value: Any, config: Any) -> Any:
    if mode == "invoke":
        return guard.invoke(value, config)
    if mode == "batch":
        return guard.batch([value], config, return_exceptions=True)[0]
    if mode == "ainvoke":
        return await guard.ainvoke(value, config)
    return (await guard.abatch([value], config, return_exceptions=True))[0]


MODES = ["invoke", "batch", "ainvoke", "abatch"]


@pytest.mark.parametrize("mode", MODES)
async def test_config_and_callbacks_propagate_to_tagged_child_runs(mode: str) -> None:
    recorder = Recorder()
    guard = make_guard(action="route", fallback=FALLBACK)
    config: Any = {
        "callbacks": [recorder],
        "tags": ["my-app"],
        "metadata": {"user": "u1"},
        "run_name": "guarded",
    }
    await call(guard, mode, UNSURE, config)
    (root_id,) = [i for i, r in recorder.runs.items() if r["parent"] is None]
    assert recorder.runs[root_id]["name"] == "guarded"
    assert recorder.runs[root_id]["kind"] == "chat_model"
    children = {r["name"]: r for r in recorder.runs.values() if r["parent"] == root_id}
    assert {"esi_generate", "esi_intervene", "esi_score"} <= set(children)
    assert "esi:score" in children["esi_score"]["tags"]
    assert "my-app" in children["esi_score"]["tags"]
    assert children["esi_score"]["metadata"]["user"] == "u1"
    fallback_runs = [r for r in recorder.runs.values() if "esi:fallback" in r["tags"]]
    assert fallback_runs and fallback_runs[0]["parent"] == root_id


@pytest.mark.parametrize("mode", MODES)
async def test_each_step_shows_the_question_and_a_small_summary(mode: str) -> None:
    recorder = Recorder()
    await call(make_guard(), mode, UNSURE, {"callbacks": [recorder]})
    steps = {r["name"]: r for r in recorder.runs.values() if r["parent"] is not None}
    assert all(step["inputs"] == {"question": UNSURE} for step in steps.values())
    assert steps["esi_generate"]["outputs"] == {"answer": "The Nile river", "n_tokens": 3}
    assert len(steps["esi_intervene"]["outputs"]["variants"]) == 10
    scored = steps["esi_score"]["outputs"]
    assert set(scored) == {"score", "scored", "reason"} and scored["scored"] is True


@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_step_ends_its_child_run_with_the_error(mode: str) -> None:
    recorder = Recorder()
    backend = FakeBackend({SURE: "Paris"}, failures={SURE: "generate"})
    guard = ESIGuard(backend=backend, threshold=0.05, on_error="raise")
    if "batch" in mode:  # returned in place
        assert isinstance(await call(guard, mode, SURE, {"callbacks": [recorder]}), BackendError)
    else:
        with pytest.raises(BackendError, match="scripted generate failure"):
            await call(guard, mode, SURE, {"callbacks": [recorder]})
    steps = {r["name"]: r for r in recorder.runs.values() if r["parent"] is not None}
    assert set(steps) == {"esi_generate"}  # nothing after a failed generation
    assert "scripted generate failure" in str(steps["esi_generate"]["error"])


@pytest.mark.parametrize("mode", ["stream", "astream"])
async def test_a_live_stream_traces_every_step_under_the_chat_model_run(mode: str) -> None:
    recorder = Recorder()
    guard = make_guard(stream_mode="live", action="flag", on_error="flag")
    config: Any = {"callbacks": [recorder]}
    if mode == "stream":
        chunks = list(guard.stream(UNSURE, config))
    else:
        chunks = [chunk async for chunk in guard.astream(UNSURE, config)]
    assert chunks[-1].chunk_position == "last" and chunks[-1].response_metadata["esi"]
    (root_id,) = [i for i, r in recorder.runs.items() if r["parent"] is None]
    assert recorder.runs[root_id]["kind"] == "chat_model"
    children = {r["name"] for r in recorder.runs.values() if r["parent"] == root_id}
    assert {"esi_generate", "esi_intervene", "esi_score"} <= children
