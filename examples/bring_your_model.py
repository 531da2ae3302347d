"""The same chain guarded three ways: the default model, your pipeline, your ChatOpenAI.

    .venv/bin/python examples/bring_your_model.py

1. ``ESIGuard()``: the embedded SmolLM2-135M-Instruct and its shipped threshold.
2. ``ESIGuard(llm=Llama(...))``: a llama.cpp model you already loaded; the guard scores
   with the same weights (no second copy). Here the embedded GGUF stands for yours.
3. ``ESIGuard(llm=HuggingFacePipeline(...))``: a LangChain pipeline you already have, the
   same way (its model here: the embedded one, as esi_guard keeps it for transformers).
4. ``ESIGuard(llm=ChatOpenAI(...))``: a ChatOpenAI pointed at an OpenAI-compatible server
   (here a local llama.cpp server this script starts), streamed live: the answer's text
   as it is generated, then the score.

The thresholds of 2-4 are placeholders: calibrate one for your model (``esi-guard
calibrate``), then ``ESIGuard.from_calibration(path, llm=your_model)``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from langchain_core.prompts import ChatPromptTemplate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: integrations/

from esi_guard import ESIGuard, HFBackend
from esi_guard.backends import embedded_gguf, load_llama
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
    show("default model", (PROMPT | ESIGuard()).invoke(QUESTION))

    gguf = embedded_gguf()  # stands for the model file your application loads
    # llama_cpp.Llama, with weight repacking off where llama.cpp's AMX kernels would crash
    llama = load_llama(gguf, n_ctx=2048, verbose=False)
    show("llama_cpp.Llama", (PROMPT | ESIGuard(llm=llama, threshold=0.3)).invoke(QUESTION))

    from langchain_huggingface import HuggingFacePipeline
    from transformers import pipeline

    # Your pipeline's model and tokenizer (AutoModelForCausalLM.from_pretrained(...)); here
    # the embedded model's, as esi_guard kept them from its first reading of the GGUF
    # (transformers takes 20-40 s of a CPU to read a GGUF, every time).
    loaded = HFBackend.default()
    pipe = pipeline("text-generation", model=loaded.model, tokenizer=loaded.tokenizer)
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
