"""Sampled answers from a transformers model, for the sampling baselines (not for ESI)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING

from esi_guard.backends._engine_helpers import check_sampling, make_sample
from esi_guard.backends._types import Messages, Sample

if TYPE_CHECKING:
    from esi_guard.backends.hf._engine import Engine

__all__ = ["sample_answers"]


def sample_answers(
    engine: Engine,
    prompts: Sequence[Messages],
    n: int,
    temperature: float,
    max_new_tokens: int,
    seed: int,
    stop: Sequence[str] = (),
    *,
    reuse_prefix: bool,
) -> list[list[Sample]]:
    """:meth:`HFBackend.sample`'s work, under the engine's lock.

    ``reuse_prefix``: run the prompt once and copy its KV cache over the ``n`` samples.
    """
    check_sampling(n, temperature)
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_k=0,
        top_p=1.0, num_return_sequences=n, eos_token_id=engine.eos_ids,
        pad_token_id=engine.pad_id, output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    expanded = copy.deepcopy(config)  # the prompt already copied n times
    expanded.num_return_sequences = 1
    results: list[list[Sample]] = []
    with engine.lock:
        torch.manual_seed(seed)
        for prompt in prompts:
            row = engine.render(prompt)
            ids = torch.tensor([row], device=engine.device)
            with torch.inference_mode():
                cache = None
                if reuse_prefix and len(row) > 1:
                    # The prompt runs once; its KV cache is copied over the n samples.
                    cache = engine.prefill(ids[:, :-1])
                    cache.batch_repeat_interleave(n)
                    ids = ids.repeat(n, 1)  # contiguous: an expanded view decodes slower
                out = engine.model.generate(
                    input_ids=ids,
                    attention_mask=torch.ones_like(ids),
                    **{engine.cache_name: cache},
                    generation_config=config if cache is None else expanded,
                )
                new = out.sequences[:, len(row) :]
                logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)
                picked = logprobs.gather(2, new[..., None])[..., 0].cpu().tolist()
            tokens = new.cpu().tolist()
            results.append([_sample(engine, t, lp, stop)
                            for t, lp in zip(tokens, picked, strict=True)])  # fmt: skip
    return results


def _sample(
    engine: Engine, tokens: list[int], logprobs: list[float], stop: Sequence[str]
) -> Sample:
    end = next((t for t, token in enumerate(tokens) if token in engine.eos_ids), len(tokens))
    return make_sample(tokens[:end], logprobs[:end], decode=engine.decode, stop=stop)
