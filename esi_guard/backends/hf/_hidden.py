"""Hidden states read from a transformers model's own forward passes, by forward hooks.

Unlike ``output_hidden_states`` (every layer, every position), hooks keep only the selected
columns, and only inside :func:`capture`: a call without ``hidden`` runs untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from esi_guard.backends._types import Generation
from esi_guard.backends.hidden import FINAL, HiddenSpec, reduce_hidden
from esi_guard.exceptions import BackendError, ConfigurationError

__all__ = ["capture", "decoder_parts", "on_host", "with_states"]

_BLOCKS = ("layers", "h", "blocks")
"""Where decoders keep their blocks: Llama-likes ``layers``, GPT-2 ``h``, others ``blocks``."""
_NORMS = ("norm", "final_layernorm", "ln_f", "norm_f")
"""Where decoders keep their final norm (the LM head's input is its output)."""


def decoder_parts(model: Any) -> tuple[Sequence[Any], Any]:
    """A causal LM's decoder blocks and final norm; a :class:`ConfigurationError` if unknown."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    if not any(hasattr(decoder, name) for name in _BLOCKS):
        decoder = getattr(model, "model", decoder)
    blocks = next((getattr(decoder, n) for n in _BLOCKS if hasattr(decoder, n)), None)
    norm = next((getattr(decoder, n) for n in _NORMS if hasattr(decoder, n)), None)
    if blocks is None or norm is None:
        msg = (
            f"{type(model).__name__} keeps its decoder blocks or final norm under names "
            f"HFBackend does not know (blocks: {list(_BLOCKS)}, norm: {list(_NORMS)}), so it "
            "cannot read hidden states from it"
        )
        raise ConfigurationError(msg)
    return blocks, norm


@contextmanager
def capture(
    model: Any, layers: Sequence[int], select: Callable[[Any], Any]
) -> Iterator[dict[int, list[Any]]]:
    """Hooks keeping ``select(state)`` of each forward pass at each of ``layers``.

    ``select`` takes a layer's ``(batch, positions, d_model)`` output. Yields, per layer, a list of
    float32 tensors, one per pass, left on the device (a copy per pass stalls a GPU): move them once
    with :func:`on_host`. The hooks are removed on exit, even on error.
    """
    import torch

    blocks, norm = decoder_parts(model)
    bad = [layer for layer in layers if layer != FINAL and not 0 <= layer < len(blocks)]
    if bad:
        msg = f"{type(model).__name__} has no layers {bad} (blocks 0..{len(blocks) - 1}, or -1)"
        raise ConfigurationError(msg)
    kept: dict[int, list[Any]] = {layer: [] for layer in layers}

    def keeper(store: list[Any]) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            state = output[0] if isinstance(output, tuple) else output
            store.append(select(state).detach().to(torch.float32, copy=True))

        return hook

    handles = []
    try:
        for layer, store in kept.items():
            module = norm if layer == FINAL else blocks[layer]
            handles.append(module.register_forward_hook(keeper(store)))
        yield kept
    finally:
        for handle in handles:
            handle.remove()


def on_host(tensors: Sequence[Any], axis: int = 0) -> np.ndarray:
    """Kept tensors stacked along ``axis`` on their device, then copied to the host at once."""
    import torch

    return np.asarray(torch.stack(list(tensors), dim=axis).cpu().numpy())


def with_states(
    gens: Sequence[Generation | BackendError],
    spec: HiddenSpec,
    kept: dict[int, list[Any]],
    passes: int,
) -> list[Generation | BackendError]:
    """A batch's generations with their states, from what ``generate``'s passes kept.

    Only the last ``passes`` count (a chunked prefill runs extra ones); rows past a cut are dropped.
    """
    states = {layer: on_host(per_pass[-passes:], axis=1) for layer, per_pass in kept.items()}
    return [
        dataclasses.replace(
            gen,
            hidden=reduce_hidden(
                spec, {layer: s[i] for layer, s in states.items()}, len(gen.token_ids)
            ),
        )
        if isinstance(gen, Generation)
        else gen
        for i, gen in enumerate(gens)
    ]
