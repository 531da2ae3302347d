"""The transformers backend on CUDA (marked ``gpu``; skipped where no GPU is visible).

Run on the GPU machine with ``pytest -m gpu``. The embedded model in bf16 and fp16 is held
to CPU fp32: the same greedy answers where CPU fp32 is not near a tie, ESI within a stated
tolerance; prefix reuse changes nothing; 32 mixed-length prompts batch; a pass too big for
the memory the test leaves is split, and a prompt too big alone fails in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from esi_guard import ESIGuard, HFBackend  # noqa: E402
from esi_guard.backends import Generation  # noqa: E402
from esi_guard.backends.hidden import FINAL, HiddenSpec  # noqa: E402
from esi_guard.exceptions import OutOfMemoryError  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible"),
]

MARGIN = 1.0
"""A CPU fp32 step counts as clear when its top-2 logits differ by more."""
ESI_MEDIAN, ESI_MOST = 0.01, 0.05
"""Median and largest |ESI(half precision on GPU) - ESI(fp32 on CPU)| of the same answers."""
SYSTEM = "Please directly answer the following question with one or few words."


@pytest.fixture(scope="module")
def cpu(hf_backend: HFBackend) -> HFBackend:
    return hf_backend


def _guard(backend: HFBackend) -> ESIGuard:
    return ESIGuard(backend=backend, threshold=1.0, max_new_tokens=16, n_variants=10, seed=0)


def _chats(questions: list[str]) -> list[list[dict[str, str]]]:
    return [[{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
            for q in questions]  # fmt: skip


def _clear_prefix(gen: Generation) -> int:
    """Steps before the first one where this answer's top-2 logits are within MARGIN."""
    margins = gen.topk.values[:, 0] - gen.topk.values[:, 1]
    return next((t for t, m in enumerate(margins) if m <= MARGIN), len(margins))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_gpu_agrees_with_fp32_on_cpu(
    cpu: HFBackend, sciq_questions: list[str], dtype: str
) -> None:
    """Greedy steps agree until fp32 itself nears a tie; ESI of the same answers is close."""
    gpu = HFBackend.default(device="cuda", dtype=dtype)
    assert gpu.device.type == "cuda"
    chats = _chats(sciq_questions[:20])
    on_cpu = cpu.generate(chats, max_new_tokens=16, top_k=2)
    on_gpu = gpu.generate(chats, max_new_tokens=16, top_k=2)
    compared = 0
    for a, b in zip(on_cpu, on_gpu, strict=True):
        assert isinstance(a, Generation) and isinstance(b, Generation)
        clear = _clear_prefix(a)
        assert b.token_ids[:clear] == a.token_ids[:clear]
        compared += clear
    assert compared >= 40  # enough clear steps for the comparison to mean something
    prompts = [[("system", SYSTEM), ("human", q)] for q in sciq_questions[:20]]
    pairs = [(p, g.text) for p, g in zip(prompts, on_cpu, strict=True)
             if isinstance(g, Generation) and g.text.strip()]  # fmt: skip
    diffs = [abs(_guard(gpu).score(p, y).score - _guard(cpu).score(p, y).score)  # type: ignore[operator]
             for p, y in pairs]  # fmt: skip
    print(f"{dtype}: |ESI gpu - ESI cpu| over {len(diffs)} answers: "
          + " ".join(f"{d:.4f}" for d in sorted(diffs)))  # fmt: skip
    assert len(diffs) >= 15
    assert float(np.median(diffs)) <= ESI_MEDIAN and max(diffs) <= ESI_MOST


def test_hidden_states_read_on_gpu_are_the_cpus(cpu: HFBackend, sciq_questions: list[str]) -> None:
    """The hooks keep the states on the device until the passes end (one copy to the host
    then): the values are fp32 CPU's, for every answer the two devices agree on."""
    gpu = HFBackend.default(device="cuda", dtype="float32")
    spec = HiddenSpec((10, FINAL))
    chats = _chats(sciq_questions[:6])
    on_cpu = cpu.generate(chats, max_new_tokens=8, top_k=5, hidden=spec)
    on_gpu = gpu.generate(chats, max_new_tokens=8, top_k=5, hidden=spec)
    same = 0
    for a, b in zip(on_cpu, on_gpu, strict=True):
        assert isinstance(a, Generation) and isinstance(b, Generation)
        assert a.hidden is not None and b.hidden is not None
        if a.token_ids != b.token_ids:
            continue  # a near tie took another answer: other states
        same += 1
        np.testing.assert_allclose(b.hidden.values, a.hidden.values, rtol=1e-2, atol=1e-2)
    assert same >= 3


def test_prefix_reuse_on_gpu_changes_nothing(sciq_questions: list[str]) -> None:
    gpu = HFBackend.default(device="cuda", dtype="float32")
    prompts = [[("system", SYSTEM), ("human", q)] for q in sciq_questions[:8]]
    reused = [m.response_metadata["esi"]["score"] for m in _guard(gpu).batch(prompts)]
    gpu.reuse_prefix = False
    full = [m.response_metadata["esi"]["score"] for m in _guard(gpu).batch(prompts)]
    assert reused == pytest.approx(full, abs=1e-4)


def test_a_batch_of_32_mixed_length_prompts(sciq_questions: list[str]) -> None:
    """In fp32 a prompt batched with 31 others of other lengths gets what it gets alone;
    in bf16 every answer of the batch is scored; the model is never moved after loading."""
    questions = [q * (1 + i % 4) for i, q in enumerate(sciq_questions[:32])]
    exact = HFBackend.default(device="cuda", dtype="float32")
    batched = [m.response_metadata["esi"] for m in _guard(exact).batch(questions)]
    alone = [_guard(exact).invoke(q).response_metadata["esi"] for q in questions[:4]]
    for a, b in zip(alone, batched, strict=False):
        assert a["answer"] == b["answer"]
        assert b["score"] == pytest.approx(a["score"], abs=1e-3)
    half = HFBackend.default(device="cuda", dtype="bfloat16")
    moves = []
    original_to = half.model.to

    def counted(*args: Any, **kwargs: Any) -> Any:
        moves.append((args, kwargs))
        return original_to(*args, **kwargs)

    half.model.to = counted
    in_half = [m.response_metadata["esi"] for m in _guard(half).batch(questions)]
    assert all(esi["scored"] and 0 <= esi["score"] <= 1 for esi in in_half)
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
