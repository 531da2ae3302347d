"""ESI's overhead beyond generation on a Llama-3-8B-shaped model, as the paper times it.

    python -m benchmarks.timing gpu                       # on a GPU: 8B shape, bf16
    python -m benchmarks.timing gpu --tiny --device cpu   # the same code at a tiny shape (tests)

The model has random weights: what a forward pass costs does not depend on what the
weights are, and no checkpoint can be downloaded where this runs. ~40-token prompts,
5-token answers, L=10 SOC variants, k=100, batches of 1, 16 and 32 prompts, on the
transformers backend; ``--model embedded`` runs the embedded SmolLM2 instead. For each batch
size: seconds per example of the greedy answers alone; ESI's extra seconds per example
beyond them (the paper's timer starts once the greedy answers exist), for full ESI and for
sequential ESI (``min_variants=2``; with random weights the threshold is the median full
score and the stopping constant a fixed 1.0, so some prompts stop early: this times the
rounds' mechanics, not a calibrated rule); semantic entropy's extra seconds (10 samples at
T=1; the sampling, which is its cost, without the clustering); guarded/plain; peak GPU
memory.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from esi_guard import ESIGuard, HFBackend

__all__ = ["add_arguments", "measure"]

EIGHT_B = {
    "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
}  # fmt: skip
TINY = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
}  # fmt: skip
WORDS = (
    "which", "what", "when", "where", "element", "planet", "energy", "cell", "protein",
    "river", "mountain", "ocean", "gas", "metal", "acid", "animal", "plant", "organ",
    "system", "layer", "force", "wave", "light", "sound", "heat", "water", "carbon",
)  # fmt: skip


class WordTokenizer:
    """Whitespace words to ids by a fixed hash, and a plain chat template.

    Enough to drive HFBackend on random weights, where token identity carries no meaning.
    """

    chat_template = "plain"
    eos_token_id = 1
    pad_token_id = 0

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: Any) -> str:
        """``role: content`` of each message, then ``assistant:``."""
        return " ".join(f"{m['role']}: {m['content']}" for m in messages) + " assistant:"

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        """One id per whitespace word."""
        return {"input_ids": [2 + sum(map(ord, w)) * 7919 % (self.vocab_size - 2)
                              for w in text.split()]}  # fmt: skip

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """``w<id>`` per token."""
        return " ".join(f"w{i}" for i in ids)


def questions(n: int, words: int) -> list[str]:
    """``n`` synthetic questions of about ``words`` words (the template adds a few)."""
    return [
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(words)) + "?" for i in range(n)
    ]


def build(shape: dict[str, int] | None, device: str, dtype: str) -> HFBackend:
    """An HFBackend on a randomly initialised Llama of this shape (None: the embedded model)."""
    if shape is None:
        return HFBackend.default(device=device, dtype=dtype)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, eos_token_id=1, pad_token_id=0, bos_token_id=2)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    model.generation_config.eos_token_id = 1
    tokenizer = WordTokenizer(shape["vocab_size"])
    return HFBackend(model, tokenizer, model_id="random-llama", max_batch_rows=256)  # type: ignore[arg-type]


def _timed(call: Any, sync: Any) -> float:
    sync()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Times per batch size; returns the record written to ``--json``."""
    import torch

    shape = None if args.model == "embedded" else TINY if args.tiny else EIGHT_B
    backend = build(shape, args.device, args.dtype)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    settings = {"backend": backend, "n_variants": 10, "max_new_tokens": 5, "seed": 0}
    pool = questions(max(args.batches) * (args.repeats + 1), args.words)
    full = ESIGuard(threshold=1.0, **settings)  # type: ignore[arg-type]
    median = statistics.median(m.response_metadata["esi"]["score"] for m in full.batch(pool[:16]))
    sequential = ESIGuard(threshold=median, min_variants=2, stop_constant=1.0, **settings)  # type: ignore[arg-type]
    rows = []
    for size in args.batches:
        times: dict[str, list[float]] = {"generate": [], "full": [], "sequential": [], "sample": []}
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        used = []
        for repeat in range(args.repeats + 1):  # the first round warms up
            batch = pool[repeat * size : (repeat + 1) * size]
            prompts = [[("human", q)] for q in batch]
            gen = _timed(lambda p=prompts: backend.generate(
                [[{"role": "user", "content": q[0][1]}] for q in p], max_new_tokens=5, top_k=100),
                sync)  # fmt: skip
            whole = _timed(lambda p=prompts: full.batch(p), sync)
            out: list[Any] = []
            quick = _timed(lambda p=prompts, o=out: o.extend(sequential.batch(p)), sync)
            sampled = _timed(lambda p=prompts: backend.sample(
                [[{"role": "user", "content": q[0][1]}] for q in p], n=10, temperature=1.0,
                max_new_tokens=5), sync)  # fmt: skip
            if repeat:
                times["sample"].append(sampled / size)
                times["generate"].append(gen / size)
                times["full"].append(whole / size)
                times["sequential"].append(quick / size)
                used += [m.response_metadata["esi"]["variants_used"] for m in out]
        g = statistics.mean(times["generate"])
        row = {
            "batch": size,
            "generate_seconds_per_example": g,
            "full_extra_seconds_per_example": statistics.mean(times["full"]) - g,
            "sequential_extra_seconds_per_example": statistics.mean(times["sequential"]) - g,
            "sequential_variants_used_mean": statistics.mean(used),
            "semantic_entropy_extra_seconds_per_example": statistics.mean(times["sample"]),
            "guarded_over_plain": statistics.mean(times["full"]) / g,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        }
        rows.append(row)
        print(
            f"batch {size:3d}: answer {g * 1000:8.1f} ms/ex | ESI extra: full "
            f"{row['full_extra_seconds_per_example'] * 1000:8.1f} ms/ex, sequential "
            f"{row['sequential_extra_seconds_per_example'] * 1000:8.1f} ms/ex "
            f"({row['sequential_variants_used_mean']:.1f} variants); semantic entropy "
            f"{row['semantic_entropy_extra_seconds_per_example'] * 1000:8.1f} ms/ex; "
            f"guarded/plain {row['guarded_over_plain']:.2f}x",
            flush=True,
        )
    device = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    name = args.model if args.model == "embedded" else "tiny" if args.tiny else "llama-3-8b"
    return {"shape": name, "device": device,
            "dtype": args.dtype, "words": args.words, "rows": rows}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (tests, CPU)")
    parser.add_argument("--model", choices=["llama-3-8b", "embedded"], default="llama-3-8b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--words", type=int, default=36, help="words per question (~40 tokens)")
