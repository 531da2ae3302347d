r"""The same forward on each engine's kernels: what the forcing pass costs on each.

    python benchmarks/forward_kernels.py --tokens 480 --outputs 80 --repeats 6

One teacher-forcing-sized pass on the embedded SmolLM2: ``--tokens`` tokens in one
sequence, logits at the last ``--outputs`` positions (about one guarded question's rows:
11 rows of ~40 tokens, ~8 answer positions each). Timed side by side in one run, each
engine's own threads (every core): llama.cpp's decode on the file's Q4_1 weights
(``forcing_precision="model"``), on the backend's float32 and float16 copies of them
(``"f32"``, ``"f16"``: the default guard forces on the float16 one), and torch's forward
on transformers' float32 dequantization of the same file (what ``HFBackend`` forces on).
Same weights, same work: the ratios are the kernels'. Rounds alternate between the arms.
Also reported: each llama.cpp arm's largest logit difference from the float32 copy's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

if not __package__:  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from esi_guard.backends.llamacpp import LlamaCppBackend
from esi_guard.backends.llamacpp._engine import Row

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Time both forwards, alternating; print seconds per pass and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=480)
    parser.add_argument("--outputs", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import torch

    from esi_guard.backends.hf import HFBackend

    engines = {
        f"llama.cpp {precision}": LlamaCppBackend.default(forcing_precision=precision)._forcer
        for precision in ("model", "f32", "f16")
    }
    model = HFBackend.default().model
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, 40000, args.tokens)]
    row = Row(0, tokens, 0, list(range(args.tokens - args.outputs, args.tokens)))
    ids = torch.tensor([tokens])
    logits: dict[str, np.ndarray] = {}

    def on_llama(name: str) -> Callable[[], None]:
        def call() -> None:
            values = engines[name].decode([], [row])
            logits.setdefault(name, values.copy())
            engines[name].clear()

        return call

    def on_torch() -> None:
        with torch.inference_mode():
            states = model.model(ids).last_hidden_state
            model.lm_head(states[:, -args.outputs :])

    calls = {name: on_llama(name) for name in engines} | {"torch f32": on_torch}
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for step in range(args.repeats + 1):  # the first round warms up, untimed
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            if step:
                seconds[name].append(time.perf_counter() - start)
    median = {name: float(np.median(values)) for name, values in seconds.items()}
    reference = logits["llama.cpp f32"]
    out = {"tokens": args.tokens, "outputs": args.outputs, "repeats": args.repeats,
           "torch_threads": torch.get_num_threads(), "seconds": median,
           "over_torch": {name: median[name] / median["torch f32"] for name in engines},
           "max_logit_diff_vs_f32": {name: float(np.abs(values - reference).max())
                                     for name, values in logits.items()}}  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
