r"""Per-call cost of guarding a RAG prompt: context first vs question first, in ONE run.

    python -m benchmarks.timing rag --limit 20

On the same SQuAD 2.0 questions and passages, the same model and max_new_tokens, for
each of two templates (the CLI's RAG template, passage before the question; and the same
words with the question first) it times, question by question and interleaved:

* ``plain``: a plain greedy transformers call on the rendered prompt, no guard;
* ``with_prompt``: ``guard.with_prompt(prompt).invoke(...)``: question-only variants;
* ``whole message``: ``(prompt | guard).invoke(...)``: SOC over the whole human message.

``--api`` runs the same on a local llama.cpp server through the OpenAI-compatible backend
(echo mode): llama.cpp keeps the last prompt's evaluated tokens and reuses the longest
common prefix, so a context-first template's variants do not run the passage again.

It prints the mean seconds per call and each guarded call's ratio to the plain one. With
the passage first, every question-only variant shares the prompt up to the question, so
the passage is computed once per call (the backend's shared prefix); with the question
first, each variant row runs the whole passage again.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from pathlib import Path
from typing import Any

from langchain_core.prompts import ChatPromptTemplate

from esi_guard import Backend, ESIGuard, HFBackend
from esi_guard.backends import ChatMessage
from esi_guard.calibration.data import load_examples
from esi_guard.calibration.prompts import RAG_TEMPLATE
from esi_guard.guard import chat_messages

__all__ = ["add_arguments", "measure", "plain_call"]

QUESTION_FIRST = RAG_TEMPLATE.replace("Passage: {context}\n\nQuestion: {question}",
                                      "Question: {question}\n\nPassage: {context}")  # fmt: skip
MODES = ("plain", "with_prompt", "whole message")


def plain_call(backend: HFBackend, messages: list[ChatMessage], max_new_tokens: int) -> str:
    """A plain greedy transformers call on the same model, no guard."""
    import torch

    ids = torch.tensor([backend.render(messages)])
    with torch.inference_mode():
        out = backend.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=backend.tokenizer.eos_token_id,
        )
    return str(backend.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def call(mode: str, guard: ESIGuard, prompt: ChatPromptTemplate, values: dict[str, Any]) -> None:
    """One call of ``mode`` on one question."""
    if mode == "plain":
        messages = list(chat_messages(prompt.invoke(values)))
        if isinstance(guard.backend, HFBackend):
            plain_call(guard.backend, messages, guard.max_new_tokens)
        else:  # one chat completion (with the top-1 logprob the backend always asks for)
            guard.backend.generate([messages], max_new_tokens=guard.max_new_tokens, top_k=1)
    elif mode == "with_prompt":
        guard.with_prompt(prompt).invoke(values)
    else:
        (prompt | guard).invoke(values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--data", type=Path, default=Path("../shared/data/squad2/dev.json"))
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument(
        "--api",
        action="store_true",
        help="the same on a local llama.cpp server (OpenAI-compatible, echo mode) instead of "
        "transformers: does the server reuse the passage's prefix across the variants?",
    )


def measure(args: argparse.Namespace) -> None:
    """Run on transformers or on a local llama.cpp server."""
    with contextlib.ExitStack() as stack:
        if args.api:
            from integrations.llamacpp.server import LlamaServer

            server = stack.enter_context(LlamaServer.start())
            backend: Backend = server.backend(mode="echo")
        else:
            backend = HFBackend.default(device="cpu")
        run(backend, args)


def run(backend: Backend, args: argparse.Namespace) -> None:
    """Time every mode for both templates on the same questions; print the ratios."""
    guard = ESIGuard(backend=backend, threshold=1.0, max_new_tokens=args.max_new_tokens)
    examples = load_examples(args.data, limit=args.limit + 1, seed=0)
    templates = {"context first": RAG_TEMPLATE, "question first": QUESTION_FIRST}
    seconds: dict[tuple[str, str], list[float]] = {(t, m): [] for t in templates for m in MODES}
    for i, example in enumerate(examples):
        values = {"context": example.context, "question": example.question}
        for name, template in templates.items():
            prompt = ChatPromptTemplate.from_messages([("human", template)])
            for mode in MODES:
                start = time.perf_counter()
                call(mode, guard, prompt, values)
                if i:  # the first question warms up, untimed
                    seconds[(name, mode)].append(time.perf_counter() - start)
    print(f"{backend.provider} questions={args.limit} L={guard.n_variants} "
          f"max_new_tokens={args.max_new_tokens}")  # fmt: skip
    header = [f"{m} s/call" for m in MODES] + [f"{m} / plain" for m in MODES[1:]]
    print("| template | " + " | ".join(header) + " |")
    print("|---" * (2 * len(MODES)) + "|")
    for name in templates:
        mean = {m: statistics.mean(seconds[(name, m)]) for m in MODES}
        cells = [f"{mean[m]:.2f}" for m in MODES]
        cells += [f"{mean[m] / mean['plain']:.2f}x" for m in MODES[1:]]
        print(f"| {name} | " + " | ".join(cells) + " |")
