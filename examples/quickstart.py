"""Quickstart: ESIGuard over the embedded default model (SmolLM2-135M-Instruct, on CPU).

The model runs through llama.cpp in process (``LlamaCppBackend``, what ``ESIGuard()``
without a model uses when llama-cpp-python is installed): it loads in about a second.

    make demo        # or: .venv/bin/python examples/quickstart.py

For each question the guard generates the greedy answer, teacher-forces it after ten
Skip-One-Char variants of the question (the prompt prefix they share computed once) for
its ESI score. With no threshold given, the guard takes the embedded model's shipped
calibration (how it was made: the README): ESI and the answer's free signals combined into
P(wrong), the probability that the answer is wrong, flagged above the threshold. For your
own model, calibrate one on your labelled questions (``esi-guard calibrate``).
"""

from __future__ import annotations

import time

from langchain_core.prompts import ChatPromptTemplate

from esi_guard import ESIGuard

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote the play Romeo and Juliet?",
    "What is the chemical symbol for gold?",
    "Which planet is known as the Red Planet?",
    "Who proposed the theory of evolution by natural selection?",
    "In which year did the Byzantine emperor Basil II die?",
    "What is the name of the third moon of Uranus discovered by William Lassell?",
]


def main() -> None:
    prompt = ChatPromptTemplate.from_messages(
        [
            ("system", "Please directly answer the following question with one or few words."),
            ("human", "{question}"),
        ]
    )
    guard = ESIGuard(action="flag")  # the embedded model, its shipped threshold
    chain = prompt | guard
    print(f"{guard.backend.model_id} on {guard.backend.engine}, threshold {guard.threshold:.3f}\n")

    start = time.perf_counter()
    messages = chain.batch([{"question": q} for q in QUESTIONS])
    elapsed = time.perf_counter() - start

    for question, message in zip(QUESTIONS, messages, strict=True):
        esi = message.response_metadata["esi"]
        score = "unscored" if esi["score"] is None else f"{esi['score']:.3f}"
        print(f"Q: {question}")
        print(f"A: {message.content}")
        p_wrong = "" if esi.get("p_wrong") is None else f"  P(wrong)={esi['p_wrong']:.3f}"
        print(
            f"   ESI={score}{p_wrong}  threshold={esi['threshold']:.3f}  decision={esi['decision']}"
            + (f"  ({esi['reason']})" if esi["reason"] else "")
        )
        print(f"   e.g. variant: {esi['variants'][0]!r}\n")
    print(
        f"{len(QUESTIONS)} questions guarded in {elapsed:.1f}s "
        f"({elapsed / len(QUESTIONS):.2f}s per question, batched)"
    )


if __name__ == "__main__":
    main()
