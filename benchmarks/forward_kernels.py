r"""The same forward on both engines' kernels: why transformers leads llama.cpp in ``batch``.

    python benchmarks/forward_kernels.py --tokens 480 --outputs 80 --repeats 6

One teacher-forcing-sized pass on the embedded SmolLM2: ``--tokens`` tokens in one
sequence, logits at the last ``--outputs`` positions (about one guarded question's rows:
11 rows of ~40 tokens, ~8 answer positions each). Timed side by side in one run, each
engine's own threads (every core): llama.cpp's decode on the backend's float32 copy of the
Q4_1 weights (what the default guard forces on) and torch's forward on transformers'
float32 dequantization of the same file (what ``HFBackend`` forces on). Same weights, same
work: the ratio is the kernels'. Rounds alternate between the engines.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
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

    llama = LlamaCppBackend.default()
    engine = llama._forcer  # the float32 copy's context (forcing_precision="auto" -> "f32")
    model = HFBackend.default().model
    tokens = [int(t) for t in np.random.default_rng(0).integers(100, 40000, args.tokens)]
    row = Row(0, tokens, 0, list(range(args.tokens - args.outputs, args.tokens)))
    ids = torch.tensor([tokens])

    def on_llama() -> None:
        engine.decode([], [row])
        engine.clear()

    def on_torch() -> None:
        with torch.inference_mode():
            states = model.model(ids).last_hidden_state
            model.lm_head(states[:, -args.outputs :])

    seconds: dict[str, list[float]] = {"llama.cpp f32": [], "torch f32": []}
    for step in range(args.repeats + 1):  # the first round warms up, untimed
        for name, call in (("llama.cpp f32", on_llama), ("torch f32", on_torch)):
            start = time.perf_counter()
            call()
            if step:
                seconds[name].append(time.perf_counter() - start)
    mean = {name: float(np.mean(values)) for name, values in seconds.items()}
    out = {"tokens": args.tokens, "outputs": args.outputs, "repeats": args.repeats,
           "torch_threads": torch.get_num_threads(), "seconds": mean,
           "llama_over_torch": mean["llama.cpp f32"] / mean["torch f32"]}  # fmt: skip
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
