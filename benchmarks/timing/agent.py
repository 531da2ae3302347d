"""Seconds per agent question with and without ESIMiddleware, side by side in one run.

    OMP_NUM_THREADS=1 python -m benchmarks.timing agent [--limit 10] [--scoring transformers]

The agent of ``examples/agent_middleware.py`` (the embedded GGUF in process through
``ChatLlamaCpp``, one encyclopedia tool, ESI scored on the agent's own ``Llama`` through
``LlamaCppBackend``, or with ``--scoring transformers`` on the transformers backend of
the same file) answers each question twice, plain and guarded, alternating which goes first.
Both agents share one loaded model. Reports per-question seconds, their means and the
guarded/plain ratio; the answers of the two runs are compared (the middleware does not
change what the model sees, so with greedy decoding they should be the same).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from esi_guard import HFBackend

__all__ = ["add_arguments", "measure"]


def timed(agent: Any, question: str) -> tuple[float, Any]:
    """Seconds the agent takes on ``question``, and its final messages."""
    from langchain_core.messages import HumanMessage

    start = time.perf_counter()
    messages = agent.invoke({"messages": [HumanMessage(question)]})["messages"]
    return time.perf_counter() - start, messages


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--scoring", choices=["own", "transformers"], default="own")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Time both agents on each question; print the table and the ratio, return them."""
    from esi_guard.agents import ESIMiddleware
    from examples.agent_middleware import QUESTIONS, build_agent, chat_model

    model = chat_model()
    backend = {"backend": HFBackend.default()} if args.scoring == "transformers" else {}
    plain = build_agent(model, None)
    guarded = build_agent(model, ESIMiddleware(threshold=0.3, **backend))
    timed(guarded, QUESTIONS[0])  # warm both paths once
    records = []
    for i, question in enumerate(QUESTIONS[: args.limit]):
        order = [("plain", plain), ("guarded", guarded)]
        runs = dict((name, timed(agent, question)) for name, agent in order[:: 1 - 2 * (i % 2)])
        (p_s, p_msgs), (g_s, g_msgs) = runs["plain"], runs["guarded"]
        esi = g_msgs[-1].response_metadata["esi"]
        records.append(
            {
                "question": question,
                "plain_seconds": p_s,
                "guarded_seconds": g_s,
                "model_calls": sum(m.type == "ai" for m in g_msgs),
                "same_answer": esi["answer"] == p_msgs[-1].content,
                "score": esi["score"],
                "decision": esi["decision"],
            }
        )
        print(f"{p_s:6.2f}s {g_s:6.2f}s  {esi['decision']:8s} {question}")
    plain_mean = statistics.mean(r["plain_seconds"] for r in records)
    guarded_mean = statistics.mean(r["guarded_seconds"] for r in records)
    summary = {
        "questions": len(records),
        "plain_seconds_per_question": plain_mean,
        "guarded_seconds_per_question": guarded_mean,
        "guarded_over_plain": guarded_mean / plain_mean,
        "same_answers": sum(r["same_answer"] for r in records),
    }
    scored = [r for r in records if r["score"] is not None]
    if scored:
        plain_scored = statistics.mean(r["plain_seconds"] for r in scored)
        guarded_scored = statistics.mean(r["guarded_seconds"] for r in scored)
        summary |= {
            "scored_answers": len(scored),
            "scored_plain_seconds_per_question": plain_scored,
            "scored_guarded_seconds_per_question": guarded_scored,
            "scored_guarded_over_plain": guarded_scored / plain_scored,
        }
    print(json.dumps(summary, indent=2))
    return {"summary": summary, "records": records}
