"""OpenAIBackend against a real llama.cpp server with the embedded model."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import spearmanr

from esi_guard import ESIGuard, HFBackend, OpenAIBackend, SkipOneChar, esi_score
from esi_guard.backends import Forced, ForcingRequest, Generation
from integrations.llamacpp.server import CHATML, LlamaServer

# Side by side (pytest -n), the session's llama.cpp servers on one worker.
pytestmark = [
    pytest.mark.integration,
    pytest.mark.server,
    pytest.mark.slow,
    pytest.mark.xdist_group("llama_server"),
]

SYSTEM = ("system", "Answer in a few words.")


def backend(server: LlamaServer, **kwargs: Any) -> OpenAIBackend:
    kwargs.setdefault("chat_template", CHATML)
    return OpenAIBackend(server.model, base_url=server.base_url, **kwargs)


def guard(server_backend: OpenAIBackend) -> ESIGuard:
    return ESIGuard(backend=server_backend, threshold=0.3, n_variants=2, top_k=20, max_new_tokens=8)


@pytest.mark.parametrize("mode", ["echo", "chat", "auto"])
async def test_every_mode_scores_through_invoke_and_abatch(
    llama_server: LlamaServer, mode: str
) -> None:
    b = backend(llama_server, mode=mode)
    g = guard(b)
    one = g.invoke([SYSTEM, ("human", "What is the capital of France?")])
    many = await g.abatch([[SYSTEM, ("human", "What gas do plants absorb?")], "Who wrote Hamlet?"])
    for message in [one, *many]:
        esi = message.response_metadata["esi"]
        assert esi["scored"], esi["reason"]
        assert math.isfinite(esi["score"]) and esi["score"] >= 0
        assert esi["scoring"]["values"] == "logprobs"
        assert esi["scoring"]["approximate"] is (b.mode == "chat")
        assert esi["answer"]
    assert b.mode == ("chat" if mode == "chat" else "echo")  # auto found echo here
    assert b.stats.failures == 0


@pytest.mark.parametrize(
    ("template", "layout"),
    [(CHATML, "same"), (CHATML.replace("<|im_start|>", "", 1), "next")],
    ids=["prompt-starts-with-BOS", "prompt-without-BOS"],
)
def test_echo_alignment_is_detected_and_right(
    llama_server: LlamaServer, template: str, layout: str
) -> None:
    # llama-cpp-python 0.3.x shifts echo logprobs by one position when the prompt does
    # not start with its BOS token (<|im_start|> for SmolLM2). The probe must see which.
    b = backend(llama_server, mode="echo", chat_template=template)
    prompt = [{"role": "user", "content": "Name the largest planet of the solar system."}]
    gen = b.generate([prompt], max_new_tokens=8, top_k=5)[0]
    assert isinstance(gen, Generation), gen
    assert b.echo_alignment == layout
    forced = b.teacher_force(
        [ForcingRequest(prompt, [prompt], gen.token_ids, gen.text, include_original=True)],
        top_k=5,
    )[0]
    assert isinstance(forced, Forced), forced
    assert forced.original is not None
    # The answer is greedy, so under the right layout each answer token is the top-1 of
    # the echoed distribution at its own position; one position off, it is not.
    top1 = b.token_strings([int(i) for i in forced.original.ids[:, 0]])
    assert top1 == b.token_strings(list(gen.token_ids))
    # ... and echo distributions match the ones the server gave while generating.
    np.testing.assert_allclose(forced.original.values[:, 0], gen.topk.values[:, 0], atol=1e-3)


def _nq_questions(shared_data: Path, n: int) -> list[str]:
    with (shared_data / "nq_open" / "dev.jsonl").open(encoding="utf-8") as handle:
        return [
            json.loads(line)["question"] + "?" for line, _ in zip(handle, range(n), strict=False)
        ]


def test_echo_mode_agrees_with_the_transformers_backend(
    llama_server: LlamaServer,
    llama_server_2: LlamaServer,
    shared_data: Path,
    hf_backend: HFBackend,
) -> None:
    # Same GGUF in both engines, same prompts, answers and variants, k=20.
    n_questions, n_variants, k = 12, 3, 20
    questions = _nq_questions(shared_data, n_questions)
    hf = HFBackend(hf_backend.model, hf_backend.tokenizer, chat_template=CHATML)
    apis = [backend(s, mode="echo") for s in (llama_server, llama_server_2)]
    soc = SkipOneChar()
    prompts = [[{"role": "user", "content": q}] for q in questions]
    variants = [
        [[{"role": "user", "content": v}] for v in soc.variants(q, n_variants, seed=0)]
        for q in questions
    ]
    api_out: dict[int, tuple[Generation, Forced]] = {}

    def run(worker: int) -> None:
        api = apis[worker]
        for i in range(worker, n_questions, 2):
            gen = api.generate([prompts[i]], max_new_tokens=10, top_k=k)[0]
            assert isinstance(gen, Generation), gen
            request = ForcingRequest(prompts[i], variants[i], gen.token_ids, gen.text)
            forced = api.teacher_force([request], top_k=k)[0]
            assert isinstance(forced, Forced), forced
            api_out[i] = (gen, forced)

    threads = [threading.Thread(target=run, args=(w,)) for w in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(api_out) == n_questions

    api_scores, hf_scores, same_top1, positions = [], [], 0, 0
    clear_mismatches: list[tuple[str, str, float]] = []
    for i in range(n_questions):
        gen, forced = api_out[i]
        api = apis[i % 2]
        ids = hf.encode_answer(prompts[i], gen.text)
        assert len(ids) == len(gen.token_ids), gen.text  # same tokenizer, same tokens
        request = ForcingRequest(prompts[i], variants[i], ids, gen.text, include_original=True)
        hf_forced = hf.teacher_force([request], top_k=k)[0]
        assert isinstance(hf_forced, Forced) and hf_forced.original is not None
        api_scores.append(esi_score(gen.topk, forced.variants, kind="logprobs").score)
        hf_scores.append(esi_score(hf_forced.original, hf_forced.variants, kind="logits").score)
        pairs = [
            (hf_forced.original, gen.topk),
            *zip(hf_forced.variants, forced.variants, strict=True),
        ]
        for hf_top, api_top in pairs:
            # llama.cpp spells special tokens (<|im_end|>) as "": so does this decode.
            hf_first = [
                hf.tokenizer.decode([int(t)], skip_special_tokens=True) for t in hf_top.ids[:, 0]
            ]
            api_first = api.token_strings([int(t) for t in api_top.ids[:, 0]])
            margins = hf_top.values[:, 0] - hf_top.values[:, 1]  # logits: top-1 lead
            for a, b, margin in zip(hf_first, api_first, margins, strict=True):
                same_top1 += a == b
                if a != b and margin > 1.0:
                    clear_mismatches.append((a, b, float(margin)))
            positions += len(hf_first)

    rho = spearmanr(api_scores, hf_scores).statistic
    agreement = same_top1 / positions
    print(f"agreement: spearman={rho:.3f} top1={same_top1}/{positions}={agreement:.4f}")
    assert rho >= 0.9
    # llama.cpp runs Q4_1 with 8-bit activations, transformers the dequantised fp32
    # weights: near-ties may flip, a clear top-1 (leading by > 1 logit) may not.
    assert not clear_mismatches, clear_mismatches
    assert agreement >= 0.95


@pytest.mark.parametrize("mode", ["echo", "chat"])
def test_the_server_stops_the_answer_and_the_guard_scores_the_stopped_one(
    llama_server: LlamaServer, mode: str
) -> None:
    g = ESIGuard(backend=backend(llama_server, mode=mode), threshold=0.3, n_variants=2,
                 top_k=20, max_new_tokens=12)  # fmt: skip
    question = [SYSTEM, ("human", "What is the capital of France?")]
    full = g.invoke(question).response_metadata["esi"]
    word = next(w for w in full["answer"].split()[1:] if len(w) > 2)
    message = g.invoke(question, stop=[word])
    esi = message.response_metadata["esi"]
    assert word not in esi["answer"]
    assert full["answer"].strip().startswith(esi["answer"].strip())
    assert esi["scored"], esi["reason"]
    assert len(esi["answer_token_ids"]) < len(full["answer_token_ids"])
    assert message.usage_metadata is not None and message.usage_metadata["input_tokens"] > 0


def test_a_users_chat_openai_is_guarded_through_the_same_server(
    llama_server: LlamaServer,
) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(model=llama_server.model, base_url=llama_server.base_url, api_key="none")
    guarded = ESIGuard(llm=chat, threshold=0.3, n_variants=2, top_k=20, max_new_tokens=8)
    direct = ESIGuard(
        backend=OpenAIBackend(llama_server.model, base_url=llama_server.base_url),
        threshold=0.3, n_variants=2, top_k=20, max_new_tokens=8,
    )  # fmt: skip
    asked = ("What is the capital of France?", "Who wrote Hamlet?")
    questions = [[SYSTEM, ("human", q)] for q in asked]
    for ours, theirs in zip(guarded.batch(questions), direct.batch(questions), strict=True):
        a, b = ours.response_metadata["esi"], theirs.response_metadata["esi"]
        assert a["scored"] and b["scored"], (a["reason"], b["reason"])
        assert a["answer"] == b["answer"]
        assert a["score"] == pytest.approx(b["score"], abs=1e-6)
    assert guarded.backend.mode == "echo"  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["echo", "chat"])
async def test_the_server_streams_the_answer_live_and_the_pieces_join_to_it(
    llama_server: LlamaServer, mode: str
) -> None:
    g = ESIGuard(backend=backend(llama_server, mode=mode), threshold=0.3, n_variants=2,
                 top_k=20, max_new_tokens=12, stream_mode="live", on_error="flag")  # fmt: skip
    question = [SYSTEM, ("human", "What is the capital of France?")]
    chunks = list(g.stream(question))
    achunks = [c async for c in g.astream(question)]
    message = g.invoke(question)
    for got in (chunks, achunks):
        assert len(got) > 2 and got[-1].chunk_position == "last"
        assert "".join(str(c.content) for c in got) == message.content
        esi = got[-1].response_metadata["esi"]
        assert esi["scored"] and esi["score"] == pytest.approx(
            message.response_metadata["esi"]["score"], abs=1e-9
        )
    stream = g.stream(question)
    next(stream)
    stream.close()  # closing midway closes the server's stream; the backend goes on
    assert g.invoke(question).response_metadata["esi"]["scored"]
