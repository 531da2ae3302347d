"""Sampled answers from a transformers model, for the sampling baselines (not for ESI)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from esi_guard.backends._engine_helpers import check_sampling, make_sample
from esi_guard.backends._types import Messages, Sample
from esi_guard.exceptions import BackendError

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
    max_rows: int,
) -> list[list[Sample] | BackendError]:
    """:meth:`HFBackend.sample`'s work, under the engine's lock.

    Prompts are sampled together, ``n`` rows each, in passes of at most ``max_rows`` rows
    (at least one prompt a pass): one ``generate`` per pass, not one per prompt.
    ``reuse_prefix``: each prompt runs once and its KV cache is copied over its ``n`` rows.
    A prompt whose answers the context window cannot hold gets a
    :class:`~esi_guard.exceptions.ContextLengthError` in place (never run past the window).
    """
    check_sampling(n, temperature)
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_k=0,
        top_p=1.0, eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id,
        output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    per_pass = max(1, max_rows // n)
    results: list[list[Sample] | BackendError] = []
    with engine.lock:
        torch.manual_seed(seed)
        rows = [engine.render(prompt) for prompt in prompts]
        refused = [
            engine.too_long(len(row) + max_new_tokens, "the prompt plus its sampled answers")
            for row in rows
        ]
        fits = [row for row, error in zip(rows, refused, strict=True) if error is None]
        drawn: list[list[Sample]] = []
        for start in range(0, len(fits), per_pass):
            chunk = fits[start : start + per_pass]
            drawn += _sample_pass(engine, chunk, n, config, stop, reuse_prefix=reuse_prefix)
        samples = iter(drawn)
        results = [next(samples) if error is None else error for error in refused]
    return results


def _sample_pass(
    engine: Engine,
    rows: list[list[int]],
    n: int,
    config: Any,
    stop: Sequence[str],
    *,
    reuse_prefix: bool,
) -> list[list[Sample]]:
    """``n`` samples of each prompt row in one ``generate`` (rows padded on the left)."""
    import torch

    input_ids, attention = engine.left_padded(rows)
    width = input_ids.shape[1]
    ids = input_ids.to(engine.device).repeat_interleave(n, dim=0)
    mask = attention.to(engine.device).repeat_interleave(n, dim=0)
    with torch.inference_mode():
        cache = None
        if reuse_prefix and width > 1:
            # Each prompt runs once; its KV cache is copied over its n rows.
            cache = engine.prefill(input_ids[:, :-1].to(engine.device),
                                   attention[:, :-1].to(engine.device))  # fmt: skip
            cache.batch_repeat_interleave(n)
        out = engine.model.generate(
            input_ids=ids,
            attention_mask=mask,
            **{engine.cache_name: cache},
            generation_config=config,
        )
        new = out.sequences[:, width:]
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)
        picked = logprobs.gather(2, new[..., None])[..., 0].cpu().tolist()
    tokens = new.cpu().tolist()
    samples = [_sample(engine, t, lp, stop) for t, lp in zip(tokens, picked, strict=True)]
    return [samples[i : i + n] for i in range(0, len(samples), n)]


def _sample(
    engine: Engine, tokens: list[int], logprobs: list[float], stop: Sequence[str]
) -> Sample:
    end = next((t for t, token in enumerate(tokens) if token in engine.eos_ids), len(tokens))
    return make_sample(tokens[:end], logprobs[:end], decode=engine.decode, stop=stop)
