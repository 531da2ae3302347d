"""Hidden states read from a transformers model's own forward passes, by forward hooks.

A hook on decoder block ``L`` (its output: transformers' ``hidden_states[L + 1]``) and one
on the final norm (:data:`~esi_guard.backends.hidden.FINAL`, the LM head's input:
``hidden_states[-1]``) keep only the columns the caller selects, as float32 on the CPU, so
a pass never holds more than those columns; ``output_hidden_states`` would keep every
layer at every position. The hooks live only inside :func:`capture`: a call without
``hidden`` runs the model untouched.
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
    """The decoder blocks and the final norm of a causal LM.

    A :class:`ConfigurationError` naming the model's class when its decoder keeps them
    under names this backend does not know.
    """
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

    Yields ``{layer: [kept, ...]}``, one float32 tensor per forward pass in order, on the
    model's device: a copy to the host inside the pass would wait for the device at every
    hooked layer of every decoding step (on a GPU, the launch queue drained each time);
    the caller moves them once, when the passes are done (:func:`on_host`). ``select`` takes
    a layer's output, ``(batch, positions, d_model)``, and returns the part to keep. The
    hooks are removed on exit, also on an error.
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

    Each pass kept one ``(batch, d_model)`` state per layer, batch row ``i`` being
    ``gens[i]``'s: the state behind that pass's top-k row. Only the last ``passes`` (as
    many as top-k rows) count: a chunked prefill runs more passes than it makes rows.
    Each answer reduces the rows of its kept length (rows past an end token or a stop
    sequence are left out).
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
