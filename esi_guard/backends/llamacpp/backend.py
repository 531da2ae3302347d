"""``LlamaCppBackend``: the Backend API on a GGUF file run by llama.cpp in this process.

How it runs, and the parts it composes, are told in :mod:`esi_guard.backends.llamacpp`.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from esi_guard._keywords import strict_keywords
from esi_guard.backends._embedded_files import EMBEDDED_MODEL_ID, embedded_gguf
from esi_guard.backends._engine_helpers import shared_prefix, text_pieces
from esi_guard.backends._identity import file_sha256, gguf_model_id
from esi_guard.backends._session import ForcingSession, check_opening
from esi_guard.backends._template import ChatTemplate
from esi_guard.backends._types import (
    AnswerPiece,
    ChatMessage,
    Forced,
    ForcingRequest,
    Generation,
    Messages,
)
from esi_guard.backends.base import Backend
from esi_guard.backends.hidden import FINAL, HiddenSpec
from esi_guard.backends.llamacpp._chat import COMPLETION_TEMPLATE, Tokens, gguf_template
from esi_guard.backends.llamacpp._copy import check_precision, forcing_llama, resolve_precision
from esi_guard.backends.llamacpp._decoding import Greedy, greedy
from esi_guard.backends.llamacpp._engine import PREFIX_CACHE_BYTES, Engine
from esi_guard.backends.llamacpp._generation import finish, greedy_rows
from esi_guard.backends.llamacpp._loading import check_arguments, open_gguf
from esi_guard.backends.llamacpp._pack import Job, force, forced
from esi_guard.backends.llamacpp._runtime import close_at_exit, import_llama_cpp
from esi_guard.backends.llamacpp._session import Contexts, Session, cells
from esi_guard.backends.llamacpp._tap import tensor_name
from esi_guard.exceptions import BackendError, ConfigurationError

__all__ = ["COMPLETION_TEMPLATE", "LlamaCppBackend"]


class LlamaCppBackend(Backend):
    """ESI on a GGUF model run by llama.cpp in this process (llama-cpp-python).

    Build it with :meth:`from_path` or :meth:`default`; the constructor shares a loaded
    ``llama_cpp.Llama`` (e.g. the ``client`` of LangChain's ``ChatLlamaCpp``).

    Args:
        llama: A loaded ``llama_cpp.Llama``.
        model_id: Identity recorded with results; default: the GGUF file's path (the embedded
            model's id for its file). Threshold files match :attr:`model_sha256` first.
        chat_template: Jinja template overriding the GGUF's; ``"completion"`` for a base model.
        n_ctx: KV cells of the backend's context (longest prompt plus answer); default: the
            model's training context, at most 8192.
        n_threads: CPU threads of every decode, the forcing copy's too; default: the ``Llama``'s
            ``n_threads`` (one-token decodes) and ``n_threads_batch`` (forcing). Give fewer where
            processes share cores: llama.cpp's waiting threads spin and slow each other badly.
        n_seq_max: Most rows forced in one decode.
        reuse_prefix: Compute a request's shared prefix once and keep the template's lead-in
            (system prompt, role headers) for later calls; off: every row in full.
        prefix_cache: Most bytes of kept template prefixes (least recently used dropped); 0:
            prompts decoded whole (scores differ by llama.cpp's rounding).
        pack_rows: Force a request's rows in one decode (see :attr:`pack_rows`).
        forcing_precision: ``"model"`` (the file's weights), ``"f16"`` or ``"f32"`` (a float
            copy); ``"auto"`` (default): ``"f16"`` for a quantized model on the CPU whose copy
            takes at most 2 GiB, else ``"model"`` (:attr:`forcing_precision`).
    """

    provider = "llamacpp"
    values_kind = "logits"

    @strict_keywords
    def __init__(
        self,
        llama: Any,
        *,
        model_id: str | None = None,
        chat_template: str | ChatTemplate | None = None,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_seq_max: int = 16,
        reuse_prefix: bool = True,
        pack_rows: bool = True,
        forcing_precision: str = "auto",
        prefix_cache: int = PREFIX_CACHE_BYTES,
    ) -> None:
        llama_cpp = import_llama_cpp()
        check_arguments(llama, n_seq_max, n_ctx)
        check_precision(forcing_precision)
        self.llama = llama
        self.reuse_prefix = reuse_prefix
        self.prefix_cache = prefix_cache
        self.pack_rows = pack_rows
        """Force a request's rows together, in as few decodes as ``n_ctx`` and ``n_seq_max``
        allow (default), or each alone (False: a row's numbers are those it gets alone; slower)."""
        self._model_id = model_id or gguf_model_id(llama.model_path, str(llama.model_path))
        self.template = gguf_template(llama, chat_template, self._model_id)
        trained = int(llama._model.n_ctx_train()) or 8192
        window = n_ctx if n_ctx is not None else min(trained, 8192)
        self._lock = threading.Lock()
        self._engine = Engine(llama, n_ctx=window, n_seq_max=n_seq_max, n_threads=n_threads,
                              prefix_cache=prefix_cache)  # fmt: skip
        self.forcing_precision = resolve_precision(forcing_precision, llama, llama_cpp)
        """What forcing runs on (``"auto"`` resolved): ``"model"``, the file's own weights;
        ``"f16"``/``"f32"``, a float copy in the cache folder (:mod:`._copy`), faster for a small
        quantized model on a CPU, the original row forced too (:attr:`forces_original`)."""
        self._forcing_llama = forcing_llama(llama_cpp, llama, self.forcing_precision, n_threads)
        self._forcer = self._engine
        if self._forcing_llama is not None:
            self._forcer = Engine(self._forcing_llama, n_ctx=window, n_seq_max=n_seq_max,
                                  n_threads=n_threads, prefix_cache=prefix_cache)  # fmt: skip
        # A forcing copy's context has a lock of its own: forcing never waits for a
        # streamed generation (which holds the lock between its tokens), nor it for forcing.
        self._force_lock = self._lock if self._forcer is self._engine else threading.Lock()
        self._sessions = Contexts(self._forcing_llama or llama, n_seq_max, n_threads)
        close_at_exit(self)
        self._tokens = Tokens(llama, llama_cpp)
        self._n_layers = int(llama_cpp.llama_model_n_layer(llama._model.model))
        self._tapped: set[str] = set()  # graph names a probe decode found

    @classmethod
    def from_path(
        cls,
        path: str | Path,
        *,
        n_ctx: int | None = None,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        model_id: str | None = None,
        chat_template: str | ChatTemplate | None = None,
        pack_rows: bool = True,
        forcing_precision: str = "auto",
        prefix_cache: int = PREFIX_CACHE_BYTES,
        **llama_kwargs: Any,
    ) -> LlamaCppBackend:
        """Load a GGUF file.

        Args:
            path: The ``.gguf`` file.
            n_ctx: See the class; also the ``Llama``'s own context size.
            n_threads: See the class; also the ``Llama``'s own, one-token and batch.
            n_gpu_layers: Layers to offload to a GPU (a CUDA/Metal build of llama.cpp).
            model_id: See the class.
            chat_template: See the class.
            pack_rows: See the class.
            forcing_precision: See the class.
            prefix_cache: See the class.
            **llama_kwargs: Passed to ``llama_cpp.Llama`` through :func:`load_llama`.
        """
        llama = open_gguf(path, n_threads=n_threads, n_gpu_layers=n_gpu_layers, **llama_kwargs)
        return cls(
            llama,
            model_id=model_id,
            chat_template=chat_template,
            n_ctx=n_ctx,
            n_threads=n_threads,
            pack_rows=pack_rows,
            forcing_precision=forcing_precision,
            prefix_cache=prefix_cache,
        )

    @classmethod
    def default(cls, **kwargs: Any) -> LlamaCppBackend:
        """The embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF).

        ``kwargs`` go to :meth:`from_path`. It forces on a float16 copy (0.27 GB, cached once).
        """
        kwargs.setdefault("model_id", EMBEDDED_MODEL_ID)
        return cls.from_path(embedded_gguf(), **kwargs)

    @property
    def model_id(self) -> str:
        """Identity of the loaded model."""
        return self._model_id

    @property
    def model_sha256(self) -> str | None:
        """The GGUF file's sha256, hashed on first use and cached for the process."""
        return file_sha256(self.llama.model_path)

    @property
    def engine(self) -> str:
        """``llamacpp``, or ``llamacpp-f16`` / ``llamacpp-f32`` when forcing on a copy.

        Scores differ a bit, states do not (:func:`~esi_guard.backends.base.states_engine`).
        """
        return f"llamacpp-{self.forcing_precision}" if self.forces_original else "llamacpp"

    @property
    def forces_original(self) -> bool:
        """Whether forcing uses a float copy; then originals are forced too, on the same kernels."""
        return self._forcer is not self._engine

    @property
    def context_length(self) -> int:
        """Most tokens one prompt plus its answer may take."""
        return self._engine.n_ctx

    @property
    def hidden_layers(self) -> tuple[int, ...]:
        """Each block's output and the final norm's (``FINAL``), via llama.cpp's eval callback."""
        return (*range(self._n_layers), FINAL)

    @property
    def hidden_size(self) -> int:
        """The model's embedding width."""
        return int(self.llama._model.n_embd())

    def check_hidden(self, spec: HiddenSpec | None) -> None:
        """As :meth:`Backend.check_hidden`; a two-token decode (once) finds the graph's tensors."""
        super().check_hidden(spec)
        if spec is None:
            return
        names = [tensor_name(layer) for layer in spec.layers]
        if set(names) <= self._tapped:
            return
        token = max(int(self.llama._model.token_bos()), 0)
        with self._lock:
            try:
                self._engine.probe(names, token, self.hidden_size)
            except BackendError as exc:
                architecture = self.llama.metadata.get("general.architecture", "unknown")
                msg = (
                    f"llama.cpp's graph of {self.model_id} (architecture {architecture!r}) "
                    f"does not give the hidden states {names}: {exc}"
                )
                raise ConfigurationError(msg) from exc
        self._tapped.update(names)

    def _names(self, hidden: HiddenSpec | None) -> list[str]:
        """The graph names to read for ``hidden`` (checked; taps on), or none."""
        if hidden is None:
            return []
        self.check_hidden(hidden)
        return [tensor_name(layer) for layer in hidden.layers]

    def close(self) -> None:
        """Free the backend's contexts (the ``Llama`` and its weights stay)."""
        with self._lock:
            self._sessions.close()
            self._engine.close()
        with self._force_lock:
            if self._forcing_llama is not None:
                self._forcer.close()
                self._forcing_llama.close()
                self._forcing_llama = None

    def render(self, prompt: Messages) -> list[int]:
        """Prompt token ids via the chat template, generation prompt (and a BOS the model wants)."""
        return self._tokens.prompt(self.template.render(prompt))

    def _prefix(self, prompt: Messages, row: Sequence[int]) -> int:
        """How many of ``row``'s first tokens (the template's lead-in) use the prefix cache."""
        if not self.prefix_cache or not prompt:
            return 0
        bare = [*prompt[:-1], ChatMessage(role=prompt[-1]["role"], content="")]
        return shared_prefix([row, self.render(bare)], self.reuse_prefix)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of answer tokens (bytes that are not whole UTF-8 characters dropped)."""
        return self._tokens.decode(ids)

    def encode_answer(self, prompt: Messages, answer: str) -> list[int]:
        """Token ids of an answer, as they would follow the generation prompt."""
        return self._tokens.tokenize(answer, special=True)

    def generate(
        self,
        prompts: Sequence[Messages],
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> list[Generation | BackendError]:
        """Greedy answers, keeping the raw-logit top-k at each step.

        A prompt that fills the context gets a :class:`ContextLengthError` in place; an answer
        stops at the context's end (``finish_reason="length"``). Prompts are stepped together
        (:func:`._decoding.greedy_group`), their answers those of one at a time, to the bit.
        """
        names = self._names(hidden)
        results: dict[int, Generation | BackendError] = {}
        todo: list[tuple[int, list[int], int]] = []
        prefixes = []
        for index, prompt in enumerate(prompts):
            row = self.render(prompt)
            too_long = self._engine.too_long(len(row) + 1, "the prompt (plus one answer token)")
            if too_long is not None:
                results[index] = too_long
                continue
            todo.append((index, row, min(max_new_tokens, self.context_length - len(row))))
            prefixes.append(self._prefix(prompt, row))
        rows, rooms = [row for _, row, _ in todo], [room for _, _, room in todo]
        answers = greedy_rows(
            self._engine, self._lock, rows, rooms, top_k, names, self._tokens.is_end, prefixes
        )
        for (index, row, _), answer in zip(todo, answers, strict=True):
            results[index] = self._finish(answer, len(row), stop, hidden)
        return [results[index] for index in range(len(prompts))]

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
        tokens = self.stream_tokens(prompt, max_new_tokens=max_new_tokens, top_k=top_k,
                                    stop=stop, hidden=hidden)  # fmt: skip
        with closing(tokens):
            yield from text_pieces(tokens, self._tokens.decode, stop)

    def stream_tokens(
        self,
        prompt: Messages,
        *,
        max_new_tokens: int,
        top_k: int,
        stop: Sequence[str] = (),
        hidden: HiddenSpec | None = None,
    ) -> Generator[AnswerPiece | Generation | BackendError, None, None]:
        """Each token and its top-k as generated, then the :class:`Generation`; closing stops it."""
        names = self._names(hidden)
        row = self.render(prompt)
        too_long = self._engine.too_long(len(row) + 1, "the prompt (plus one answer token)")
        if too_long is not None:
            yield too_long
            return
        room = min(max_new_tokens, self.context_length - len(row))
        prefix = self._prefix(prompt, row)
        with self._lock:
            try:
                tokens, ids, values, states = yield from greedy(
                    self._engine, row, room, top_k, names, self._tokens.is_end, prefix
                )
            finally:
                self._engine.clear()
        yield self._finish((tokens, ids, values, states), len(row), stop, hidden)

    def _finish(
        self, answer: Greedy, prompt_tokens: int, stop: Sequence[str], hidden: HiddenSpec | None
    ) -> Generation | BackendError:
        """A greedy answer's :class:`Generation` (:func:`._generation.finish`)."""
        return finish(answer, prompt_tokens, stop, hidden, is_end=self._tokens.is_end,
                      decode=self._tokens.decode, model_id=self.model_id)  # fmt: skip

    def teacher_force(
        self, requests: Sequence[ForcingRequest], *, top_k: int
    ) -> list[Forced | BackendError]:
        """Force each request's answer after each of its variants.

        With ``pack_rows`` a request's rows share a decode (or a few, for a small ``n_ctx`` or
        ``n_seq_max``). A row too long gets a :class:`ContextLengthError` in place, untruncated.
        """
        failed: dict[int, BackendError] = {}
        jobs: dict[int, Job] = {}
        for number, request in enumerate(requests):
            if request.hidden is not None and not request.include_original:
                msg = "hidden states are read on the original row: set include_original"
                raise ConfigurationError(msg)
            extra = [request.prompt] if self._with_original(request) else []
            rows = [self.render(messages) for messages in [*extra, *request.variants]]
            answer = list(request.answer_ids)
            longest = max(len(row) for row in rows) + len(answer)
            too_long = self._engine.too_long(longest, "a variant plus the answer")
            if too_long is not None:
                failed[number] = too_long
                continue
            shared = shared_prefix(rows, self.reuse_prefix)
            cached = min(shared, self._prefix(request.prompt, rows[0]))
            jobs[number] = Job(rows, answer, shared, self._names(request.hidden), cached)
        taps = self.hidden_size if self.forces_original else None
        with self._force_lock:
            tops, states = force(self._forcer, list(jobs.values()), top_k, self.pack_rows, taps)
        done = dict(zip(jobs, zip(tops, states, strict=True), strict=True))
        return [
            failed[number]
            if number in failed
            else forced(*done[number], request, self._with_original(request), self.model_id)
            for number, request in enumerate(requests)
        ]

    def open_forcing(
        self, request: ForcingRequest, *, top_k: int, max_answer_tokens: int
    ) -> ForcingSession:
        """An incremental forcing session: each row's KV cells kept between pieces.

        On a context of its own, holding no lock (:mod:`._session`): other calls go on beside it.
        Its distributions equal ``teacher_force``'s up to llama.cpp's rounding; an answer over
        ``max_answer_tokens`` may not fit (a :class:`ContextLengthError` in place).
        """
        check_opening(request)
        extra = [request.prompt] if self._with_original(request) else []
        rows = [self.render(messages) for messages in [*extra, *request.variants]]
        shared = shared_prefix(rows, self.reuse_prefix)
        engine = self._sessions.take(cells(rows, shared, max_answer_tokens), len(rows))
        return Session(self, engine, rows, shared, request, top_k=top_k,
                       with_original=bool(extra), model_id=self.model_id,
                       release=self._sessions.give, window=self.context_length)  # fmt: skip

    def _with_original(self, request: ForcingRequest) -> bool:
        return request.include_original or self.forces_original

    def __repr__(self) -> str:
        return f"LlamaCppBackend({self.model_id!r}, n_ctx={self.context_length})"
