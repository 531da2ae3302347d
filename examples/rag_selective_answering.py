"""Selective answering in a small RAG chain: retriever -> guard.with_prompt(prompt) -> text.

    .venv/bin/python examples/rag_selective_answering.py

The retriever is a tiny keyword-overlap retriever over a handful of documents (swap in
any LangChain retriever). The prompt is the usual RAG shape: instructions, retrieved
context and question in one human message, context first. ``guard.with_prompt`` renders it
once per variant with only ``{question}`` changed, so the instructions and the passages
are the same bytes in every row (and computed once: they are the rows' shared prefix).
When the answer moves with the wording of the question, the guard withholds it and says
so. The chain ends at the guard, so the decision is kept (a ``StrOutputParser`` after it
would keep the text alone). The threshold is a placeholder: the embedded model's shipped
one was fitted on closed-book questions, not on this prompt.
"""

from __future__ import annotations

import re

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough

from esi_guard import ESIGuard

DOCUMENTS = [
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "Photosynthesis converts carbon dioxide and water into glucose and oxygen using light.",
    "The mitochondrion is the organelle that produces most of the cell's ATP.",
    "Mount Kilimanjaro, in Tanzania, is the highest mountain in Africa.",
    "The Treaty of Westphalia of 1648 ended the Thirty Years' War.",
]

QUESTIONS = [
    "When was the Eiffel Tower completed?",
    "Which organelle produces most of the cell's ATP?",
    "What is the highest mountain in Africa?",
    "Which war ended with the Treaty of Westphalia?",
    "Who was the first person to climb Kilimanjaro in winter?",
    "What gas is released by photosynthesis besides glucose?",
]


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3}


class KeywordRetriever(BaseRetriever):
    """Returns the documents sharing the most words with the query."""

    documents: list[Document]
    k: int = 2

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        ranked = sorted(self.documents, key=lambda d: -len(_words(d.page_content) & _words(query)))
        return ranked[: self.k]


def format_docs(docs: list[Document]) -> str:
    return "\n".join(f"- {d.page_content}" for d in docs)


def main() -> None:
    retriever = KeywordRetriever(documents=[Document(page_content=t) for t in DOCUMENTS])
    prompt = ChatPromptTemplate.from_messages(
        [
            (
                "human",
                "Use the following pieces of retrieved context to answer the question in a "
                "few words. If you don't know the answer, say that you don't know.\n"
                "Context:\n{context}\n\nQuestion: {question}",
            )
        ]
    )
    guard = ESIGuard(
        threshold=0.25,
        action="abstain",
        abstain_message="I can't answer that reliably from the documents.",
    )
    chain = {
        "context": retriever | format_docs,
        "question": RunnablePassthrough(),
    } | guard.with_prompt(prompt)

    for question, message in zip(QUESTIONS, chain.batch(QUESTIONS), strict=True):
        esi = message.response_metadata["esi"]
        score = "unscored" if esi["score"] is None else f"{esi['score']:.3f}"
        print(
            f"Q: {question}\nA: {message.content}\n   ESI={score} "
            f"decision={esi['decision']}"
            + ("" if esi["decision"] == "accept" else f"  (withheld: {esi['answer']!r})")
            + "\n"
        )


if __name__ == "__main__":
    main()
