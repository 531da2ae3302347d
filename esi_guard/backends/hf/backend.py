"""Transformers backend: greedy generation and batched teacher forcing on a local model.

White-box: values are raw logits (before any logits processor); only top-k leaves the device.
Teacher forcing runs a request's variants in ONE forward pass, left-padded so every answer starts
in one column ``lead``: the logits at column ``lead - 1 + t`` are answer token ``t``'s. Hidden
states come from forward hooks in those passes (none without ``hidden``). One lock, in the
``Engine`` (``_engine.py``), serialises calls into the model: one backend serves many threads.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from esi_guard._keywords import strict_keywords
from esi_guard.backends._embedded_files import EMBEDDED_GGUF, EMBEDDED_MODEL_ID, embedded_model_dir
from esi_guard.backends._identity import (
    check_model_path,
    embedded_gguf_in,
    file_sha256,
    gguf_model_id,
)
from esi_guard.backends._types import Forced, ForcingRequest, Generation, Messages
from esi_guard.backends.base import Backend
from esi_guard.backends.hf._converted import keep, kept_folder, read_kept
from esi_guard.backends.hf._engine import Engine, import_torch, split_on_oom
from esi_guard.backends.hf._force import Rendered, force_group, pack
from esi_guard.backends.hf._hidden import decoder_parts
from esi_guard.backends.hf._stream import stream_answer
from esi_guard.backends.hidden import FINAL, HiddenSpec
from esi_guard.exceptions import BackendError, ConfigurationError, ModelLoadError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["HFBackend"]

CPU_BATCH_ROWS = 32
"""Rows a forward pass holds at most by default on a CPU."""
GPU_BATCH_ROWS = 256
"""On a GPU: a guarded batch of 32 prompts (10 variants + original: 352 rows) takes 2 passes."""


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    torch = import_torch()
    return "cuda" if torch.cuda.is_available() else "cpu"


def _resolve_dtype(dtype: Any) -> Any:
    if dtype in (None, "auto") or not isinstance(dtype, str):
        return dtype
    torch = import_torch()
    resolved = getattr(torch, dtype, None)
    if not isinstance(resolved, torch.dtype):
        msg = f"unknown dtype {dtype!r}; expected e.g. 'float32', 'bfloat16' or 'auto'"
        raise ConfigurationError(msg)
    return resolved


class HFBackend(Backend):
    """ESI on any transformers causal LM, on CPU or GPU.

    Build it with :meth:`from_pretrained` or :meth:`default`; the constructor takes a loaded model.

    Args:
        model: A causal LM.
        tokenizer: Its tokenizer, with a chat template (or pass ``chat_template``).
        model_id: Identity recorded with results and matched by threshold files; default: the
            model's name. Give the same one wherever the same weights are named differently.
        chat_template: Jinja chat template overriding the tokenizer's.
        max_batch_rows: Most rows in one forward pass (a request's never split); default 32 on a
            CPU, 256 on a GPU. A pass too big for the device's memory is halved and retried.
        reuse_prefix: Force the prefix all rows of a pass share once, its KV cache expanded over
            them; off: every row in full (same results, to float tolerance).
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
        max_batch_rows: int | None = None,
        reuse_prefix: bool = True,
    ) -> None:
        if max_batch_rows is None:
            on_cpu = getattr(getattr(model, "device", None), "type", "cpu") == "cpu"
            max_batch_rows = CPU_BATCH_ROWS if on_cpu else GPU_BATCH_ROWS
        if max_batch_rows < 1:
            msg = f"max_batch_rows must be >= 1, got {max_batch_rows}"
            raise ConfigurationError(msg)
        if chat_template is None and not getattr(tokenizer, "chat_template", None):
            msg = (
                "the tokenizer has no chat template; pass chat_template='...' "
                "(a Jinja template) to HFBackend"
            )
            raise ConfigurationError(msg)
        self.max_batch_rows = max_batch_rows
        self.reuse_prefix = reuse_prefix
        name = str(getattr(model.config, "_name_or_path", "") or "unknown")
        self._gguf_path = embedded_gguf_in(name)
        """The GGUF file the weights were read from, where known (its digest identifies them)."""
        if model_id is None and self._gguf_path is not None:
            model_id = EMBEDDED_MODEL_ID
        self._engine = Engine(
            model, tokenizer, chat_template=chat_template, model_id=model_id or name
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        gguf_file: str | None = None,
        device: str = "auto",
        dtype: Any = "auto",
        chat_template: str | None = None,
        max_batch_rows: int | None = None,
        model_id: str | None = None,
        keep_converted: bool = True,
        **model_kwargs: Any,
    ) -> HFBackend:
        """Load a causal LM by hub id, local path, or GGUF file.

        Args:
            name_or_path: Model id, folder or ``.gguf`` file; a missing local path is a
                :class:`ModelLoadError` before any hub lookup.
            gguf_file: GGUF file name inside the folder ``name_or_path`` (needs ``gguf``).
            device: ``"auto"`` (CUDA when available), ``"cpu"``, ``"cuda"``, ``"cuda:1"``...
            dtype: ``"auto"``, a torch dtype, or its name (``"bfloat16"``).
            chat_template: Override the tokenizer's chat template.
            max_batch_rows: See the class docstring.
            model_id: See the class docstring; default ``name_or_path`` (plus the GGUF file).
            keep_converted: Cache transformers' reading of a local GGUF file for fast reloads
                (:mod:`~esi_guard.backends.hf._converted`); not with ``model_kwargs``.
            **model_kwargs: Passed to ``AutoModelForCausalLM.from_pretrained``.
        """
        where = str(name_or_path)
        check_model_path(where)
        where = str(Path(where).expanduser()) if where.startswith("~") else where
        import_torch()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if gguf_file is None and where.endswith(".gguf") and Path(where).is_file():
            where, gguf_file = str(Path(where).parent), Path(where).name
        local_gguf = Path(where, gguf_file) if gguf_file else None
        if local_gguf is not None and not local_gguf.is_file():
            local_gguf = None  # a GGUF on the hub: read from its cache, digest unknown
        extra = {"gguf_file": gguf_file} if gguf_file else {}
        digest = file_sha256(local_gguf) if local_gguf and keep_converted else None
        kept = kept_folder(digest, dtype) if digest and not model_kwargs else None
        try:
            read = read_kept(kept, _resolve_dtype(dtype)) if kept else None
            if read is None:
                tokenizer = AutoTokenizer.from_pretrained(where, **extra)
                model: Any = AutoModelForCausalLM.from_pretrained(
                    where, dtype=_resolve_dtype(dtype), **extra, **model_kwargs
                )
                if kept:
                    keep(kept, tokenizer, model)
            else:  # named as the GGUF's own reading is: a wrapper of it finds the same file
                tokenizer, model = read
                model.config._name_or_path = tokenizer.name_or_path = where
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
    def model(self) -> Any:
        """The causal LM."""
        return self._engine.model

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """Its tokenizer."""
        return self._engine.tokenizer

    @property
    def chat_template(self) -> str | None:
        """The chat template overriding the tokenizer's, if one was given."""
        return self._engine.chat_template

    @property
    def model_id(self) -> str:
        """Identity of the loaded model."""
        return self._engine.model_id

    @property
    def model_sha256(self) -> str | None:
        """The ``.gguf``'s sha256 (hashed once); None for a folder (matched on :attr:`model_id`)."""
        return None if self._gguf_path is None else file_sha256(self._gguf_path)

    @property
    def device(self) -> torch.device:
        """Device the model's parameters live on."""
        return self._engine.device

    @property
    def hidden_layers(self) -> tuple[int, ...] | None:
        """Blocks ``0..n-1`` and :data:`FINAL`; None where blocks or final norm are not found."""
        try:
            blocks, _ = decoder_parts(self.model)
        except ConfigurationError:
            return None
        return (*range(len(blocks)), FINAL)

    @property
    def hidden_size(self) -> int | None:
        """The model's ``hidden_size`` (its text config's, for a multimodal one)."""
        config = self.model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        size = getattr(text, "hidden_size", None)
        return size if isinstance(size, int) else None

    def check_hidden(self, spec: HiddenSpec | None) -> None:
        """A :class:`ConfigurationError` unless ``spec``'s layers are this model's (and found)."""
        if spec is not None:
            decoder_parts(self.model)
        super().check_hidden(spec)

    def render(self, prompt: Messages) -> list[int]:
        """Token ids of a prompt through the chat template, generation prompt added.

        Adds the BOS that ``add_bos_token`` models (Gemma, Llama) need where the template omits it.
        """
        return self._engine.render(prompt)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of answer tokens, special tokens left out."""
        return self._engine.decode(ids)

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """Token ids of an answer, as they would follow the generation prompt."""
        return list(self.tokenizer(answer, add_special_tokens=False)["input_ids"])

    @property
    def context_length(self) -> int | None:
        """Most tokens the model attends to (prompt plus answer), when it says."""
        return self._engine.context_length

    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> list[Generation | BackendError]:
        """Greedy answers, keeping the top-k of the raw logits at each step.

        A prompt that fills the window gets a :class:`ContextLengthError` in place; an answer stops
        at its end (``finish_reason="length"``). ``stop`` cuts the decoded answer after generation.
        """
        self.check_hidden(hidden)
        engine = self._engine
        results: list[Generation | BackendError | None] = [None] * len(prompts)
        with engine.lock:
            fits: list[tuple[int, list[int]]] = []
            for i, prompt in enumerate(prompts):
                row = self.render(prompt)
                results[i] = engine.too_long(len(row) + 1, "the prompt (plus one answer token)")
                if results[i] is None:
                    fits.append((i, row))
            for start in range(0, len(fits), self.max_batch_rows):
                chunk = fits[start : start + self.max_batch_rows]

                def run(part: list[tuple[int, list[int]]]) -> list[Generation | BackendError]:
                    # Each answer's room is its own prompt's: a prompt near the window's
                    # end must not cut the answers batched with it short.
                    window = engine.context_length
                    rooms = [
                        max_new_tokens if window is None else min(max_new_tokens, window - len(r))
                        for _, r in part
                    ]
                    out: list[Generation | BackendError | None] = [None] * len(part)
                    for room in sorted(set(rooms), reverse=True):
                        at = [k for k, each in enumerate(rooms) if each == room]
                        rows = [part[k][1] for k in at]
                        gens = engine.generate_chunk(rows, room, top_k, stop, hidden=hidden)
                        for k, gen in zip(at, gens, strict=True):
                            out[k] = gen
                    return [gen for gen in out if gen is not None]

                for (i, _), gen in zip(chunk, split_on_oom(run, chunk), strict=True):
                    results[i] = gen
        return [r for r in results if r is not None]

    def stream_generate(
        self,
        prompt: Messages,
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Generator[str | Generation | BackendError, None, None]:
        """The answer's text as generated, then its :class:`Generation`; closing early stops it."""
        self.check_hidden(hidden)
        return stream_answer(self._engine, prompt, max_new_tokens, top_k, stop, hidden)

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Force each request's answer after all its variants, one forward pass per group.

        A request too long for the window gets a :class:`ContextLengthError` in place (never
        truncated); ``hidden`` needs ``include_original`` (else :class:`ConfigurationError`).
        """
        for request in requests:
            if request.hidden is not None and not request.include_original:
                msg = (
                    f"a ForcingRequest with hidden={request.hidden} needs "
                    "include_original=True: the states are read from the original row"
                )
                raise ConfigurationError(msg)
            self.check_hidden(request.hidden)
        engine = self._engine
        results: list[Forced | BackendError | None] = [None] * len(requests)
        with engine.lock:
            fits: list[Rendered] = []
            for i, request in enumerate(requests):
                extra = [request.prompt] if request.include_original else []
                rows = [self.render(messages) for messages in [*extra, *request.variants]]
                longest = max(len(row) for row in rows) + len(request.answer_ids)
                results[i] = engine.too_long(longest, "a variant plus the answer")
                if results[i] is None:
                    fits.append(Rendered(i, request, rows))
            for group in pack(fits, self.max_batch_rows, reuse_prefix=self.reuse_prefix):
                forced = split_on_oom(
                    lambda part: force_group(engine, part, top_k, reuse_prefix=self.reuse_prefix),
                    group,
                )
                for item, result in zip(group, forced, strict=True):
                    results[item.index] = result
        return [r for r in results if r is not None]
