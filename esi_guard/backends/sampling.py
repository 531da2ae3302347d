"""Sampled answers, for the benchmarks' sampling baselines (ESI never samples; not top-level API).

:func:`sample` draws ``n`` answers per prompt from an :class:`~esi_guard.HFBackend` or a
:class:`~esi_guard.LlamaCppBackend` on its own engine. Each token's log-probability is the model's
own (raw logits, temperature 1); an answer ends before the first of ``stop``, as a greedy one does;
a prompt whose answers the context window cannot hold gets a
:class:`~esi_guard.ContextLengthError` in its place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from esi_guard.backends._engine_helpers import Tok, stopped_length
from esi_guard.backends._types import Messages
from esi_guard.backends.hf import HFBackend
from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.exceptions import BackendError, ConfigurationError

if TYPE_CHECKING:
    from esi_guard.backends.hf._engine import Engine as HFEngine
    from esi_guard.backends.llamacpp._engine import Engine as LlamaEngine

__all__ = ["SAMPLERS", "Sample", "make_sample", "sample"]


@dataclass(frozen=True)
class Sample:
    """One sampled answer: its text and the model's log-probability of each of its tokens."""

    text: str
    token_logprobs: tuple[float, ...]
    tokens: tuple[str, ...] = ()
    """Each token's text, in order (for token-level SAR); empty when a backend gives none."""

    @property
    def logprob(self) -> float:
        """Log-probability of the whole answer."""
        return float(sum(self.token_logprobs))

    @property
    def mean_logprob(self) -> float:
        """Length-normalised log-probability."""
        return self.logprob / max(len(self.token_logprobs), 1)


Drawn = list[list[Sample] | BackendError]
SAMPLERS = (HFBackend, LlamaCppBackend)
"""The backends :func:`sample` draws answers from."""


def sample(
    backend: object,
    prompts: Sequence[Messages],
    *,
    n: int,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
    stop: Sequence[str] = (),
) -> Drawn:
    """``n`` answers per prompt sampled at ``temperature`` (no top-k/top-p cut), seeded by ``seed``.

    Raises:
        ConfigurationError: ``n < 1``, ``temperature <= 0``, or another backend.
    """
    if n < 1 or temperature <= 0:
        msg = f"sample needs n >= 1 and temperature > 0, got n={n}, temperature={temperature}"
        raise ConfigurationError(msg)
    if not isinstance(backend, SAMPLERS):
        name = type(backend).__name__
        msg = f"{name} cannot sample: the sampling baselines need an HFBackend or a LlamaCppBackend"
        raise ConfigurationError(msg)
    if isinstance(backend, HFBackend):
        return _hf(backend, prompts, n, temperature, max_new_tokens, seed, stop)
    return _llamacpp(backend, prompts, n, temperature, max_new_tokens, seed, stop)


def make_sample(
    tokens: Sequence[Tok],
    logprobs: Sequence[float],
    *,
    decode: Callable[[Sequence[Tok]], str],
    stop: Sequence[str] = (),
) -> Sample:
    """A sampled answer's tokens (end of sequence already cut), cut before its first stop."""
    kept = stopped_length(tokens, decode, stop)
    end = len(tokens) if kept is None else kept
    return Sample(
        text=decode(tokens[:end]).strip(),
        token_logprobs=tuple(float(lp) for lp in logprobs[:end]),
        tokens=tuple(decode([one]) for one in tokens[:end]),
    )


def _hf(
    backend: HFBackend, prompts: Sequence[Messages], n: int, temperature: float,
    max_new_tokens: int, seed: int, stop: Sequence[str],
) -> Drawn:  # fmt: skip
    """Prompts sampled together, ``n`` rows each, in passes of at most ``max_batch_rows`` rows.

    One ``generate`` per pass; with ``reuse_prefix`` each prompt's KV cache is copied over its rows.
    """
    import torch
    from transformers import GenerationConfig

    engine = backend._engine
    config = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature, top_k=0,
        top_p=1.0, eos_token_id=engine.eos_ids, pad_token_id=engine.pad_id,
        output_logits=True, return_dict_in_generate=True,
    )  # fmt: skip
    per_pass = max(1, backend.max_batch_rows // n)
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
            drawn += _hf_pass(engine, chunk, n, config, stop, reuse_prefix=backend.reuse_prefix)
        samples = iter(drawn)
        return [next(samples) if error is None else error for error in refused]


def _hf_pass(
    engine: HFEngine, rows: list[list[int]], n: int, config: Any, stop: Sequence[str], *,
    reuse_prefix: bool,
) -> list[list[Sample]]:  # fmt: skip
    """``n`` samples of each prompt row in one ``generate`` (rows padded on the left)."""
    import torch

    input_ids, attention = engine.left_padded(rows)
    width = input_ids.shape[1]
    ids = input_ids.to(engine.device).repeat_interleave(n, dim=0)
    mask = attention.to(engine.device).repeat_interleave(n, dim=0)
    with torch.inference_mode():
        cache = None
        if reuse_prefix and width > 1:
            cache = engine.prefill(input_ids[:, :-1].to(engine.device),
                                   attention[:, :-1].to(engine.device))  # fmt: skip
            cache.batch_repeat_interleave(n)
        out = engine.model.generate(
            input_ids=ids, attention_mask=mask, **{engine.cache_name: cache},
            generation_config=config,
        )  # fmt: skip
        new = out.sequences[:, width:]
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1)
        picked = logprobs.gather(2, new[..., None])[..., 0].cpu().tolist()
    samples = []
    for tokens, lps in zip(new.cpu().tolist(), picked, strict=True):
        end = next((t for t, token in enumerate(tokens) if token in engine.eos_ids), len(tokens))
        samples.append(make_sample(tokens[:end], lps[:end], decode=engine.decode, stop=stop))
    return [samples[i : i + n] for i in range(0, len(samples), n)]


def _llamacpp(
    backend: LlamaCppBackend, prompts: Sequence[Messages], n: int, temperature: float,
    max_new_tokens: int, seed: int, stop: Sequence[str],
) -> Drawn:  # fmt: skip
    """Each prompt decoded once, its ``n`` answers together in groups of ``n_seq_max``.

    One generator seeded with ``seed`` draws every prompt's answers, in order.
    """
    engine, tokens = backend._engine, backend._tokens
    rng = np.random.default_rng(seed)
    results: Drawn = []
    for row in (backend.render(prompt) for prompt in prompts):
        need = len(row) + min(n, engine.n_seq_max) * max_new_tokens
        too_long = engine.too_long(need, f"the prompt plus {n} sampled answers")
        if too_long is not None:
            results.append(too_long)
            continue
        room = min(max_new_tokens, engine.n_ctx - len(row) - 1)
        drawn: list[tuple[list[int], list[float]]] = []
        with backend._lock:
            for start in range(0, n, engine.n_seq_max):
                try:
                    count = min(engine.n_seq_max, n - start)
                    drawn += _llamacpp_group(engine, row, count, temperature, room, rng,
                                             tokens.is_end)  # fmt: skip
                finally:
                    engine.clear()
        results.append([make_sample(t, lp, decode=tokens.decode, stop=stop) for t, lp in drawn])
    return results


def _llamacpp_group(
    engine: LlamaEngine, row: Sequence[int], n: int, temperature: float, room: int,
    rng: np.random.Generator, is_end: Callable[[int], bool],
) -> list[tuple[list[int], list[float]]]:  # fmt: skip
    """``n`` answers after ``row``, the prompt's KV cells shared by the ``n`` sequences."""
    from esi_guard.backends.llamacpp._engine import Row

    seqs = list(range(n))
    shared = [(row[:-1], seqs)] if len(row) > 1 else []
    logits = engine.decode(shared, [Row(s, [row[-1]], len(row) - 1, [0]) for s in seqs])
    tokens: list[list[int]] = [[] for _ in seqs]
    logprobs: list[list[float]] = [[] for _ in seqs]
    live = seqs
    for step in range(room):
        scaled = logits.astype(np.float64)
        logp = scaled - scaled.max(axis=1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(axis=1, keepdims=True))
        hot = np.exp((scaled - scaled.max(axis=1, keepdims=True)) / temperature)
        hot /= hot.sum(axis=1, keepdims=True)
        nxt = []
        for i, seq in enumerate(live):
            token = int(rng.choice(hot.shape[1], p=hot[i]))
            if is_end(token):
                continue
            tokens[seq].append(token)
            logprobs[seq].append(float(logp[i, token]))
            nxt.append(seq)
        live = nxt
        if not live or step == room - 1:
            break
        position = len(row) + step
        logits = engine.decode([], [Row(seq, [tokens[seq][-1]], position, [0]) for seq in live])
    return list(zip(tokens, logprobs, strict=True))
