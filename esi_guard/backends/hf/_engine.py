"""The transformers work of :class:`~esi_guard.backends.hf.HFBackend`.

:class:`Engine` holds a loaded model and tokenizer with what every call needs; the forcing,
sampling and streaming helpers take one. Torch and transformers are imported lazily.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from esi_guard._imports import import_extra
from esi_guard.backends._engine_helpers import finish_greedy
from esi_guard.backends._types import Generation, Messages
from esi_guard.backends.hf._hidden import capture, with_states
from esi_guard.backends.hidden import HiddenSpec
from esi_guard.exceptions import (
    BackendError,
    ConfigurationError,
    ContextLengthError,
    OutOfMemoryError,
)
from esi_guard.scoring import TopK

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["Engine", "import_torch", "split_on_oom"]


def import_torch() -> Any:
    """The ``torch`` module, or an ImportError naming the extra to install."""
    return import_extra("torch", needed_by="HFBackend", what="PyTorch and transformers", extra="hf")


Part = TypeVar("Part")
Out = TypeVar("Out")


def split_on_oom(
    run: Callable[[list[Part]], list[Out]], items: list[Part]
) -> list[Out | BackendError]:
    """``run(items)``; on running out of device memory, the halves, each the same way.

    Only PyTorch's OOM is caught; an item too big alone gets an :class:`OutOfMemoryError` in place.
    """
    torch = import_torch()
    try:
        return list(run(items))
    except torch.OutOfMemoryError as exc:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if len(items) == 1:
            error = OutOfMemoryError(f"out of device memory for this prompt alone: {exc}")
            error.__cause__ = exc
            return [error]
    middle = len(items) // 2
    return [*split_on_oom(run, items[:middle]), *split_on_oom(run, items[middle:])]


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids: list[int] = []
    for source in (model.generation_config.eos_token_id, tokenizer.eos_token_id):
        if source is None:
            continue
        for value in source if isinstance(source, list | tuple) else [source]:
            if int(value) not in ids:
                ids.append(int(value))
    if not ids:
        msg = "neither the model nor the tokenizer defines an end-of-sequence token"
        raise ConfigurationError(msg)
    return ids


class Engine:
    """A loaded causal LM and its tokenizer, put in evaluation mode.

    Args:
        model: A causal LM.
        tokenizer: Its tokenizer.
        chat_template: Jinja chat template overriding the tokenizer's (None: the tokenizer's).
        model_id: The identity results and errors carry.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        chat_template: str | None,
        model_id: str,
    ) -> None:
        self.model: Any = model
        model.eval()  # type: ignore[no-untyped-call]
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.model_id = model_id
        self.lock = threading.Lock()
        """Held for every call into the model, so one engine can serve many threads."""
        self.eos_ids = _eos_ids(model, tokenizer)
        forward = inspect.signature(type(model).forward).parameters  # not a patched instance
        self.can_trim = "logits_to_keep" in forward
        """Whether the output layer can run at the last positions only."""
        # transformers 5.24 renamed the KV cache (argument and output) to `cache`.
        self.cache_name = "cache" if "cache" in forward else "past_key_values"
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else self.eos_ids[0])

    @property
    def device(self) -> torch.device:
        """Device the model's parameters live on."""
        device: torch.device = next(self.model.parameters()).device
        return device

    @property
    def context_length(self) -> int | None:
        """Most tokens the model attends to (prompt plus answer), when it says."""
        limits = [
            int(value)
            for value in (
                getattr(self.model.config, "max_position_embeddings", None),
                getattr(self.tokenizer, "model_max_length", None),
            )
            if isinstance(value, int) and 0 < value < 10**7  # tokenizers say 1e30 for "none"
        ]
        return min(limits) if limits else None

    def too_long(self, tokens: int, what: str) -> ContextLengthError | None:
        """The error for ``what`` of ``tokens`` tokens, or None where it fits the window."""
        window = self.context_length
        if window is None or tokens <= window:
            return None
        return ContextLengthError(
            f"{what} has {tokens} tokens; the model's context window is {window}"
        )

    def render(self, prompt: Messages) -> list[int]:
        """Prompt ids via the chat template: generation prompt, and BOS if ``add_bos_token``."""
        text = self.tokenizer.apply_chat_template(
            [{"role": m["role"], "content": m["content"]} for m in prompt],
            add_generation_prompt=True,
            tokenize=False,
            chat_template=self.chat_template,
        )
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        bos = getattr(self.tokenizer, "bos_token_id", None)
        if getattr(self.tokenizer, "add_bos_token", False) and bos is not None and ids[:1] != [bos]:
            ids.insert(0, bos)
        return ids

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of token ids, special tokens left out."""
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def prefill(self, input_ids: Any, attention_mask: Any = None) -> Any:
        """Run ``input_ids`` (rows left-padded per ``attention_mask``) once; their KV cache."""
        if attention_mask is None:
            return self.model(input_ids=input_ids, use_cache=True)[self.cache_name]
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return self.model(input_ids=input_ids, attention_mask=attention_mask,
                          position_ids=positions, use_cache=True)[self.cache_name]  # fmt: skip

    def topk_to_numpy(self, logits: torch.Tensor, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k on the device; only ids and values move to the host."""
        k = min(top_k, logits.shape[-1])
        values, ids = logits.float().topk(k, dim=-1)
        return ids.cpu().numpy().astype(np.int64), values.cpu().numpy().astype(np.float64)

    def left_padded(self, rows: list[list[int]]) -> tuple[Any, Any]:
        """Input ids and attention mask of ``rows``, padded on the left to the longest."""
        torch = import_torch()
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention[i, width - len(row) :] = 1
        return input_ids, attention

    def generate_chunk(
        self,
        rows: list[list[int]],
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str],
        streamer: Any = None,
        halt: Any = None,
        hidden: HiddenSpec | None = None,
    ) -> list[Generation | BackendError]:
        """Greedy answers to prompt ``rows`` in one ``generate`` call (the caller holds the lock).

        ``streamer`` and ``halt`` go to ``generate`` (see ``_stream``); ``hidden``: each answer's
        states, read by hooks from the same passes.
        """
        torch = import_torch()
        from transformers import GenerationConfig

        input_ids, attention = self.left_padded(rows)
        width = input_ids.shape[1]
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        hooks: Any = (
            contextlib.nullcontext({})
            if hidden is None
            else capture(self.model, hidden.layers, lambda state: state[:, -1])
        )
        with torch.inference_mode(), hooks as kept:
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                generation_config=config,
                streamer=streamer,
                stopping_criteria=halt,
            )
        ids, values = self.topk_to_numpy(torch.stack(out.logits, dim=1), top_k)
        new_tokens = out.sequences[:, width:].cpu().tolist()
        gens = [
            self.finish(tokens, ids[i], values[i], stop, len(rows[i]))
            for i, tokens in enumerate(new_tokens)
        ]
        if hidden is None:
            return gens
        return with_states(gens, hidden, kept, passes=len(out.logits))

    def finish(
        self,
        tokens: list[int],
        ids: np.ndarray,
        values: np.ndarray,
        stop: Sequence[str],
        prompt_tokens: int,
    ) -> Generation | BackendError:
        """A greedy answer's :class:`Generation`, cut at its end token or first stop sequence."""
        return finish_greedy(
            tokens,
            TopK(ids, values),
            is_end=self.eos_ids.__contains__,
            decode=self.decode,
            stop=stop,
            prompt_tokens=prompt_tokens,
            model_id=self.model_id,
        )
