"""The transformers backend on CUDA (marked ``gpu``; skipped where no GPU is visible).

Run on the GPU machine with ``pytest -m gpu``. The embedded model in bf16 and fp16 is held
to CPU fp32: the same greedy answers where CPU fp32 is not near a tie, ESI within a stated
tolerance; prefix reuse changes nothing; 32 mixed-length prompts batch; a pass too big for
the memory the test leaves is split, and a prompt too big alone fails in place.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from esi_guard import ESIGuard, HFBackend  # noqa: E402
from esi_guard.backends import Generation  # noqa: E402
from esi_guard.exceptions import OutOfMemoryError  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible"),
]

MARGIN = 1.0
"""A CPU fp32 answer counts as clear when every position's top-2 logits differ by more."""
ESI_TOLERANCE = 0.05
"""Most |ESI(half precision on GPU) - ESI(fp32 on CPU)| allowed for a clear answer."""
SYSTEM = "Please directly answer the following question with one or few words."


@pytest.fixture(scope="module")
def cpu(hf_backend: HFBackend) -> HFBackend:
    return hf_backend


def _guard(backend: HFBackend) -> ESIGuard:
    return ESIGuard(backend=backend, threshold=1.0, max_new_tokens=16, n_variants=10, seed=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_gpu_agrees_with_fp32_on_cpu(
    cpu: HFBackend, sciq_questions: list[str], dtype: str
) -> None:
    gpu = HFBackend.default(device="cuda", dtype=dtype)
    assert gpu.device.type == "cuda"
    prompts = [[("system", SYSTEM), ("human", q)] for q in sciq_questions[:20]]
    on_cpu = [m.response_metadata["esi"] for m in _guard(cpu).batch(prompts)]
    on_gpu = [m.response_metadata["esi"] for m in _guard(gpu).batch(prompts)]
    gens = cpu.generate([[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
                         for q in sciq_questions[:20]], max_new_tokens=16, top_k=2)  # fmt: skip
    clear = 0
    for a, b, gen in zip(on_cpu, on_gpu, gens, strict=True):
        assert isinstance(gen, Generation)
        margins = gen.topk.values[:, 0] - gen.topk.values[:, 1]
        if len(margins) and margins.min() > MARGIN:
            clear += 1
            assert a["answer"] == b["answer"]
            assert b["score"] == pytest.approx(a["score"], abs=ESI_TOLERANCE)
    assert clear >= 5  # enough clear answers for the comparison to mean something


def test_prefix_reuse_on_gpu_changes_nothing(sciq_questions: list[str]) -> None:
    gpu = HFBackend.default(device="cuda", dtype="float32")
    prompts = [[("system", SYSTEM), ("human", q)] for q in sciq_questions[:8]]
    reused = [m.response_metadata["esi"]["score"] for m in _guard(gpu).batch(prompts)]
    gpu.reuse_prefix = False
    full = [m.response_metadata["esi"]["score"] for m in _guard(gpu).batch(prompts)]
    assert reused == pytest.approx(full, abs=1e-4)


def test_a_batch_of_32_mixed_length_prompts(sciq_questions: list[str]) -> None:
    gpu = HFBackend.default(device="cuda", dtype="bfloat16")
    moves = []
    original_to = gpu.model.to

    def counted(*args: Any, **kwargs: Any) -> Any:
        moves.append((args, kwargs))
        return original_to(*args, **kwargs)

    gpu.model.to = counted  # the model is moved once, when loaded: never per call
    questions = [q * (1 + i % 4) for i, q in enumerate(sciq_questions[:32])]
    batched = [m.response_metadata["esi"] for m in _guard(gpu).batch(questions)]
    alone = [_guard(gpu).invoke(q).response_metadata["esi"] for q in questions[:4]]
    assert all(esi["scored"] for esi in batched)
    for a, b in zip(alone, batched, strict=False):
        assert a["answer"] == b["answer"]
        assert b["score"] == pytest.approx(a["score"], abs=ESI_TOLERANCE)
    assert moves == []


def test_out_of_memory_splits_the_batch_and_fails_only_what_never_fits(
    sciq_questions: list[str],
) -> None:
    gpu = HFBackend.default(device="cuda", dtype="bfloat16")
    long = [q + " Explain in detail. " * 200 for q in sciq_questions[:16]]
    prompts = [[{"role": "user", "content": q}] for q in long]
    expected = gpu.generate(prompts[:2], max_new_tokens=4, top_k=5)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    headroom = 300 * 2**20  # room for a pass over a few long prompts, not for sixteen
    fraction = (torch.cuda.memory_allocated() + headroom) / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    try:
        gens = gpu.generate(prompts, max_new_tokens=4, top_k=5)
        huge = [{"role": "user", "content": "word " * 7000}]  # within the context window
        (alone,) = gpu.generate([huge], max_new_tokens=4, top_k=5)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    assert all(isinstance(g, Generation) for g in gens)
    assert [g.token_ids for g in gens[:2]] == [g.token_ids for g in expected]  # type: ignore[union-attr]
    # Alone it either fits or fails in place with its reason: never a crash.
    assert isinstance(alone, Generation) or (
        isinstance(alone, OutOfMemoryError) and alone.code == "out_of_memory"
    )
