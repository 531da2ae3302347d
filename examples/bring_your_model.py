"""The same chain guarded three ways: the default model, your pipeline, your ChatOpenAI.

    .venv/bin/python examples/bring_your_model.py

1. ``ESIGuard(threshold=...)``: the embedded SmolLM2-135M-Instruct, loaded on first use.
2. ``ESIGuard(llm=HuggingFacePipeline(...))``: a LangChain pipeline you already have; the
   guard scores with the same weights (here: the embedded model's, so no second copy).
3. ``ESIGuard(llm=ChatOpenAI(...))``: a ChatOpenAI pointed at an OpenAI-compatible server
   (here a local llama.cpp server this script starts), streamed live: the answer's text
   as it is generated, then the score.
"""

from __future__ import annotations

import sys
from pathlib import Path

from langchain_core.prompts import ChatPromptTemplate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: integrations/

from esi_guard import ESIGuard
from esi_guard.backends.default import embedded_backend
from integrations.llamacpp.server import LlamaServer

PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Please directly answer the following question with one or few words."),
        ("human", "{question}"),
    ]
)
QUESTION = {"question": "Which planet is known as the Red Planet?"}


def show(label: str, message: object) -> None:
    esi = message.response_metadata["esi"]  # type: ignore[attr-defined]
    print(f"{label:<22} {message.content!r:<45} score={esi['score']} {esi['decision']}")  # type: ignore[attr-defined]


def main() -> None:
    show("default model", (PROMPT | ESIGuard(threshold=0.3)).invoke(QUESTION))

    from langchain_huggingface import HuggingFacePipeline
    from transformers import pipeline

    model = embedded_backend()  # stands for the model your application already loaded
    pipe = pipeline("text-generation", model=model.model, tokenizer=model.tokenizer)
    guard = ESIGuard(llm=HuggingFacePipeline(pipeline=pipe), threshold=0.3)
    show("HuggingFacePipeline", (PROMPT | guard).invoke(QUESTION))

    from langchain_openai import ChatOpenAI

    with LlamaServer.start() as server:
        chat = ChatOpenAI(model=server.model, base_url=server.base_url, api_key="none")
        live = ESIGuard(llm=chat, threshold=0.3, n_variants=5, top_k=20,
                        stream_mode="live", action="flag", on_error="flag")  # fmt: skip
        print("ChatOpenAI, live:      ", end="", flush=True)
        for chunk in (PROMPT | live).stream(QUESTION):
            if chunk.chunk_position == "last":
                esi = chunk.response_metadata["esi"]
                print(f"{chunk.content}   [score={esi['score']:.3f} {esi['decision']}]")
            else:
                print(chunk.content, end="", flush=True)


if __name__ == "__main__":
    main()
