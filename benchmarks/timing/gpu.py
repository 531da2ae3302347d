"""ESI's overhead beyond generation on a Llama-3-8B-shaped model, as the paper times it.

    python -m benchmarks.timing gpu                       # on a GPU: 8B shape, bf16
    python -m benchmarks.timing.gpu --profile DIR         # alone (no other subject's imports)
    python -m benchmarks.timing gpu --tiny --device cpu   # the same code at a tiny shape (tests)

The model has random weights: what a forward pass costs does not depend on what the
weights are, and no checkpoint can be downloaded where this runs. ~40-token prompts,
5-token answers, L=10 SOC variants, k=100, batches of 1, 16 and 32 prompts, on the
transformers backend; ``--model embedded`` runs the embedded SmolLM2 instead. For each batch
size: seconds per example of the greedy answers alone; full ESI's extra seconds per example
beyond them (the paper's timer starts once the greedy answers exist); semantic entropy's
extra seconds (10 samples at T=1; the sampling, which is its cost, without the
clustering); guarded/plain; the extra seconds of the guards that spend less
(:func:`cheap_guards`: without ESI, with a hidden-state probe, the value cascade and the
share it sends to ESI); peak GPU memory. ``--profile DIR``: torch's profiler over one
guarded batch of the largest size (:func:`profiled`).
tests/gpu/on_device.sh runs it on the device machine (docs/development.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from esi_guard import ESIGuard, HFBackend
from esi_guard.backends.hidden import FINAL
from esi_guard.backends.sampling import sample
from esi_guard.cascade import Band
from esi_guard.combined import CombinedScore, HiddenProbe

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


def build(
    shape: dict[str, int] | None, device: str, dtype: str, rows: int | None = None
) -> HFBackend:
    """An HFBackend on a randomly initialised Llama of this shape (None: the embedded model).

    ``rows``: its ``max_batch_rows`` (None: the backend's default for the embedded model, 256
    for the random one).
    """
    if shape is None:
        return HFBackend.default(device=device, dtype=dtype, max_batch_rows=rows)
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
    return HFBackend(model, tokenizer, model_id="random-llama", max_batch_rows=rows or 256)  # type: ignore[arg-type]


def _timed(call: Any, sync: Any) -> float:
    sync()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start


def cheap_guards(backend: HFBackend, full: ESIGuard, pool: list[str], settings: dict[str, Any]
                 ) -> dict[str, ESIGuard]:  # fmt: skip
    """The guards that spend less than full ESI, their scores centred on ``pool``'s answers.

    ``free``: a combined score of the answer's own NLL (no variant forced); ``probe``: the
    same with a hidden-state term over the middle block and the final norm (its capture
    cost: the weights are random); ``cascade``: the value cascade, ESI inside a band that
    holds the middle third of ``pool``'s free scores. With random weights no score means
    anything: the shapes and the share sent to ESI are what is timed.
    """
    import numpy as np

    esi = [m.response_metadata["esi"] for m in full.batch(pool)]
    nll = np.array([e["signals"]["nll"] for e in esi])
    score = np.array([e["score"] for e in esi])

    def centred(values: Any) -> tuple[float, float]:
        return float(np.median(values)), max(float(np.std(values)), 1e-6)

    (m, s), (me, se) = centred(nll), centred(score)
    common = {"intercept": 0.0, "strength": 1.0, "n_fit": len(pool)}
    free = CombinedScore(features=("nll",), mean=(m,), scale=(s,), weights=(1.0,), **common)  # type: ignore[arg-type]
    with_esi = CombinedScore(features=("esi", "nll"), mean=(me, m), scale=(se, s),
                             weights=(1.0, 1.0), **common)  # type: ignore[arg-type]  # fmt: skip
    p = 1 / (1 + np.exp(-(nll - m) / s))
    band = Band(low=float(np.quantile(p, 1 / 3)), high=float(np.quantile(p, 2 / 3)))
    layers = backend.hidden_layers or (FINAL,)
    read = (layers[len(layers) // 2], FINAL)
    positions = ("prompt_last", "answer_mean")
    width = int(backend.hidden_size or 0)
    weights = np.random.default_rng(0).normal(0, 1e-3, len(read) * len(positions) * width)
    probe = HiddenProbe(layers=read, positions=positions, hidden_size=width,
                        weights=tuple(weights.tolist()), components=8)  # fmt: skip
    probed = free.model_copy(update={"hidden": probe})
    return {
        "free": ESIGuard(threshold=0.5, combined=free, **settings),
        "probe": ESIGuard(threshold=0.5, combined=probed, **settings),
        "cascade": ESIGuard(threshold=0.5, combined=with_esi, free_score=free, probe_band=band,
                            **settings),
    }  # fmt: skip


def profiled(guard: ESIGuard, prompts: list[Any], folder: Path, cuda: bool) -> dict[str, Any]:
    """One guarded batch under torch's profiler: its tables and trace into ``folder``.

    The backend's calls are labelled (``esi.generate``, ``esi.teacher_force``) so the
    tables split the guard's time into its answer, its forcing pass and the rest (host).
    """
    import gzip

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    backend = guard.backend
    originals = {name: getattr(backend, name) for name in ("generate", "teacher_force")}

    def labelled(name: str, call: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            with record_function(f"esi.{name}"):
                return call(*args, **kwargs)

        return run

    for name, call in originals.items():
        setattr(backend, name, labelled(name, call))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    try:
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            with record_function("esi.batch"):
                guard.batch(prompts)
            if cuda:
                torch.cuda.synchronize()
            wall = time.perf_counter() - start
    finally:
        for name in originals:
            delattr(backend, name)
    folder.mkdir(parents=True, exist_ok=True)
    events = prof.key_averages()
    device_sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    tables = [f"# one guarded batch of {len(prompts)}: {wall:.3f} s wall",
              "## by device time (self)", events.table(sort_by=device_sort, row_limit=35),
              "## by host time (total)",
              events.table(sort_by="cpu_time_total", row_limit=35)]  # fmt: skip
    (folder / f"profile-batch{len(prompts)}.txt").write_text("\n\n".join(tables))
    trace = folder / f"trace-batch{len(prompts)}.json"
    prof.export_chrome_trace(str(trace))
    with trace.open("rb") as raw, gzip.open(f"{trace}.gz", "wb") as packed:
        packed.write(raw.read())
    trace.unlink()
    from torch.autograd import DeviceType

    host = {e.key: e.cpu_time_total / 1e6 for e in events  # the labels' host-side events
            if e.key.startswith("esi.") and e.device_type == DeviceType.CPU}  # fmt: skip
    kernels = sum(e.self_device_time_total for e in events  # as the table's footer sums
                  if e.device_type == DeviceType.CUDA and not e.is_user_annotation)  # fmt: skip
    counts = {e.key: e.count for e in events
              if e.key in ("cudaStreamSynchronize", "cudaMemcpyAsync", "aten::item")}  # fmt: skip
    return {
        "batch": len(prompts),
        "wall_seconds": wall,
        "host_seconds": host,
        "device_kernel_seconds": kernels / 1e6 if cuda else None,
        "calls": counts,
    }  # fmt: skip


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Times per batch size; returns the record written to ``--json``."""
    import torch

    shape = None if args.model == "embedded" else TINY if args.tiny else EIGHT_B
    backend = build(shape, args.device, args.dtype, args.max_batch_rows)
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    settings = {"backend": backend, "n_variants": 10, "max_new_tokens": 5, "seed": 0}
    pool = questions(max(args.batches) * (args.repeats + 1), args.words)
    full = ESIGuard(threshold=1.0, **settings)  # type: ignore[arg-type]
    cheap = cheap_guards(backend, full, pool[-32:], settings)
    plain = [[{"role": "user", "content": q}] for q in pool]
    rows = []
    for size in args.batches:
        arms = ("generate", "full", "sample", *cheap)
        times: dict[str, list[float]] = {arm: [] for arm in arms}
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        sent: list[bool] = []
        for repeat in range(args.repeats + 1):  # the first round warms up
            window = slice(repeat * size, (repeat + 1) * size)
            batch, messages = pool[window], plain[window]
            took = {
                "generate": _timed(lambda m=messages: backend.generate(
                    m, max_new_tokens=5, top_k=100), sync),
                "full": _timed(lambda b=batch: full.batch(b), sync),
                "sample": _timed(lambda m=messages: sample(
                    backend, m, n=10, temperature=1.0, max_new_tokens=5), sync),
            }  # fmt: skip
            kept: list[Any] = []
            for arm, guard in cheap.items():
                took[arm] = _timed(lambda b=batch, g=guard, o=kept: o.extend(g.batch(b)), sync)
            if repeat:
                for arm, seconds in took.items():
                    times[arm].append(seconds / size)
                sent += [m.response_metadata["esi"]["decided_by"] == "esi"
                         for m in kept[-size:]]  # fmt: skip
        mean = {arm: statistics.mean(values) for arm, values in times.items()}
        g = mean["generate"]
        row = {
            "batch": size,
            "generate_seconds_per_example": g,
            "full_extra_seconds_per_example": mean["full"] - g,
            "semantic_entropy_extra_seconds_per_example": mean["sample"],
            "guarded_over_plain": mean["full"] / g,
            "free_extra_seconds_per_example": mean["free"] - g,
            "probe_extra_seconds_per_example": mean["probe"] - g,
            "cascade_extra_seconds_per_example": mean["cascade"] - g,
            "cascade_esi_share": statistics.mean(sent),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        }
        rows.append(row)
        ms = {k: v * 1000 for k, v in row.items() if k.endswith("per_example")}
        print(
            f"batch {size:3d}: answer {g * 1000:8.1f} ms/ex | ESI extra: full "
            f"{ms['full_extra_seconds_per_example']:8.1f} ms/ex; semantic entropy "
            f"{ms['semantic_entropy_extra_seconds_per_example']:8.1f} ms/ex; "
            f"guarded/plain {row['guarded_over_plain']:.2f}x | without ESI "
            f"{ms['free_extra_seconds_per_example']:.1f}, with a states probe "
            f"{ms['probe_extra_seconds_per_example']:.1f}, cascade "
            f"{ms['cascade_extra_seconds_per_example']:.1f} ms/ex "
            f"(ESI on {row['cascade_esi_share']:.0%})",
            flush=True,
        )
    device = torch.cuda.get_device_name() if cuda else args.device
    name = args.model if args.model == "embedded" else "tiny" if args.tiny else "llama-3-8b"
    record = {"shape": name, "device": device, "dtype": args.dtype, "words": args.words,
              "max_batch_rows": backend.max_batch_rows, "rows": rows}  # fmt: skip
    if args.profile is not None:
        size = max(args.batches)
        record["profile"] = profiled(full, pool[:size], args.profile, cuda)
        print(f"profile of one guarded batch of {size}: {record['profile']}", flush=True)
    return record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """This subject's options."""
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--tiny", action="store_true", help="a tiny model (tests, CPU)")
    parser.add_argument("--model", choices=["llama-3-8b", "embedded"], default="llama-3-8b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 16, 32])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--words", type=int, default=36, help="words per question (~40 tokens)")
    parser.add_argument("--max-batch-rows", type=int, help="the backend's max_batch_rows")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="profile one guarded batch of the largest size; tables and trace "
                             "into DIR")  # fmt: skip


if __name__ == "__main__":  # python -m benchmarks.timing.gpu: without the other subjects' imports
    import json

    cli = argparse.ArgumentParser(prog="python -m benchmarks.timing.gpu")
    add_arguments(cli)
    cli.add_argument("--json", type=Path)
    options = cli.parse_args()
    done = measure(options)
    if options.json is not None:
        options.json.write_text(json.dumps(done, indent=1))
