"""The llama.cpp work of :class:`~esi_guard.backends.llamacpp.LlamaCppBackend`.

A llama.cpp context of the backend's own on the ``Llama``'s loaded model (weights shared, the
``Llama``'s own context untouched), with a unified KV cache of many sequences: a prefix several
rows share is computed once and its cells shared with each row; logits are asked only where needed
and only each row's top-k is kept. The cache is cleared after every call, so nothing leaks between
calls but the prefixes :meth:`Engine.load_prefix` keeps, restored bit for bit. Hidden states come
from the same decodes (:mod:`._tap`, after :meth:`Engine.enable_taps`).
"""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from esi_guard.backends.llamacpp._tap import Tap
from esi_guard.exceptions import BackendError, ContextLengthError

__all__ = ["PREFIX_CACHE_BYTES", "Engine", "Row", "topk_rows"]

PREFIX_CACHE_BYTES = 64 * 2**20
"""Most bytes of KV cells :meth:`Engine.load_prefix` keeps, least recently used dropped first."""


def topk_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k ids and values of each row of ``logits``, largest first."""
    k = min(k, logits.shape[-1])
    part = np.argpartition(-logits, k - 1, axis=-1)[..., :k]
    values = np.take_along_axis(logits, part, axis=-1)
    order = np.argsort(-values, axis=-1, kind="stable")
    ids = np.take_along_axis(part, order, axis=-1)
    return ids.astype(np.int64), np.take_along_axis(values, order, axis=-1).astype(np.float64)


@dataclass(frozen=True)
class Row:
    """One sequence's tokens in a decode.

    ``tokens`` go at positions ``start, start + 1, ...`` of sequence ``seq`` (the earlier ones are
    cached, or a shared prefix in the same decode); ``outputs``: offsets whose logits it returns.
    """

    seq: int
    tokens: Sequence[int]
    start: int = 0
    outputs: Sequence[int] = ()


class Engine:
    """A llama.cpp context of our own on a loaded ``llama_cpp.Llama``'s model.

    Args:
        llama: The loaded ``llama_cpp.Llama`` (its model is used, its context is not).
        n_ctx: KV cells of the context: all rows of one decode together.
        n_seq_max: Most sequences (rows) in one decode.
        n_threads: CPU threads per decode; None: the ``Llama``'s (``n_threads_batch`` for many).
        prefix_cache: Most bytes of prefix KV cells kept between calls (0: none; same numbers).
    """

    def __init__(
        self,
        llama: Any,
        *,
        n_ctx: int,
        n_seq_max: int,
        n_threads: int | None,
        prefix_cache: int = PREFIX_CACHE_BYTES,
    ) -> None:
        import llama_cpp

        self._lib = llama_cpp
        self._llama = llama
        threads = n_threads or int(llama.context_params.n_threads)
        threads_batch = n_threads or int(llama.context_params.n_threads_batch) or threads
        params = llama_cpp.llama_context_default_params()
        n_ctx = -(-n_ctx // 256) * 256  # llama.cpp pads the context to 256 cells
        params.n_ctx = n_ctx
        params.n_batch = n_ctx
        params.n_ubatch = min(512, n_ctx)
        params.n_seq_max = n_seq_max
        params.kv_unified = True
        params.n_threads = threads
        params.n_threads_batch = threads_batch
        params.no_perf = True
        self.n_seq_max = n_seq_max
        self._params = params
        self._tap: Tap | None = None
        self.states: dict[str, np.ndarray] = {}
        """The tensors the last decode given ``names`` read, at its outputs."""
        self._context = self._make_context()
        self.n_ctx = min(int(self._context.n_ctx()), n_ctx)
        """Most tokens one decode (and the KV cache) holds."""
        self.n_vocab = int(llama.n_vocab())
        self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, n_seq_max)
        self._views = self._batch_views()
        self._prefix_cache = prefix_cache
        self._prefixes: OrderedDict[tuple[int, ...], ctypes.Array[ctypes.c_uint8]] = OrderedDict()
        self.prefix_hits = 0
        """How many :meth:`load_prefix` calls found their prefix kept (for benchmarks)."""

    def _make_context(self) -> Any:
        from llama_cpp import _internals

        return _internals.LlamaContext(model=self._llama._model, params=self._params, verbose=False)

    @property
    def taps(self) -> bool:
        """Whether decodes can read hidden states (:meth:`enable_taps` was called)."""
        return self._tap is not None

    def enable_taps(self, width: int) -> None:
        """Remake the context with the eval callback to read states; it stays on (~1-4% a step)."""
        if self._tap is not None:
            return
        tap = Tap(self._lib, width)
        self._params.cb_eval = tap.callback
        self._params.cb_eval_user_data = None
        self._context.close()
        self._context = self._make_context()
        self._tap = tap

    def too_long(self, tokens: int, what: str) -> ContextLengthError | None:
        """The error of ``what`` (``tokens`` long) where the context cannot hold it; else None."""
        if tokens <= self.n_ctx:
            return None
        return ContextLengthError(
            f"{what} has {tokens} tokens; the backend's context holds {self.n_ctx} (n_ctx)"
        )

    def probe(self, names: Sequence[str], token: int, width: int) -> None:
        """Decode ``token`` twice reading ``names``, taps on; the KV cache is left empty.

        Raises:
            BackendError: The graph has no tensor of one of ``names``.
        """
        self.enable_taps(width)
        try:
            self.decode([], [Row(0, [token, token], 0, [1])], names)
        finally:
            self.clear()

    def _batch_views(self) -> dict[str, np.ndarray]:
        batch, n = self._batch, self.n_ctx
        return {
            "token": np.ctypeslib.as_array(batch.token, shape=(n,)),
            "pos": np.ctypeslib.as_array(batch.pos, shape=(n,)),
            "n_seq_id": np.ctypeslib.as_array(batch.n_seq_id, shape=(n,)),
            "logits": np.ctypeslib.as_array(
                ctypes.cast(batch.logits, ctypes.POINTER(ctypes.c_int8)), shape=(n,)
            ),
        }

    def close(self) -> None:
        """Free the context and the batch (the model stays with its ``Llama``)."""
        if self._batch is not None:
            self._lib.llama_batch_free(self._batch)
            self._batch = None
        self._prefixes.clear()
        self._context.close()

    def clear(self) -> None:
        """Empty the KV cache: cells freed, not zeroed (a free cell is masked out until written)."""
        if self._context.memory is not None:
            self._lib.llama_memory_clear(self._context.memory, False)

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Let sequence ``target`` share the KV cells of ``source``'s first ``length`` tokens."""
        self._context.kv_cache_seq_cp(source, target, 0, length)

    def drop(self, seq: int) -> None:
        """Remove a sequence from the KV cache (cells it shares stay with the others)."""
        self._context.kv_cache_seq_rm(seq, -1, -1)

    def keep(self, seq: int, length: int) -> None:
        """Remove sequence ``seq``'s tokens from position ``length`` on (its prefix stays)."""
        self._context.kv_cache_seq_rm(seq, length, -1)

    def save(self, seq: int) -> ctypes.Array[ctypes.c_uint8]:
        """Sequence ``seq``'s KV cells, copied out (for :meth:`restore`)."""
        size = int(self._lib.llama_state_seq_get_size(self._context.ctx, seq))
        data = (ctypes.c_uint8 * size)()
        if int(self._lib.llama_state_seq_get_data(self._context.ctx, data, size, seq)) != size:
            msg = f"llama.cpp could not copy out sequence {seq}'s KV cells"
            raise BackendError(msg)
        return data

    def restore(self, data: ctypes.Array[ctypes.c_uint8], seq: int) -> None:
        """Put cells :meth:`save` copied out back, as sequence ``seq`` (same values)."""
        if not int(self._lib.llama_state_seq_set_data(self._context.ctx, data, len(data), seq)):
            msg = f"llama.cpp could not restore sequence {seq}'s KV cells (context full?)"
            raise BackendError(msg)

    def load_prefix(self, tokens: Sequence[int]) -> None:
        """Put ``tokens``' KV cells under sequence 0 of the empty cache: kept, or decoded alone."""
        key = tuple(tokens)
        data = self._prefixes.get(key)
        if data is not None:
            self._prefixes.move_to_end(key)
            self.restore(data, 0)
            self.prefix_hits += 1
            return
        self.decode([], [Row(0, key, 0, ())])
        if self._prefix_cache <= 0:
            return
        data = self.save(0)
        if len(data) > self._prefix_cache:
            return
        self._prefixes[key] = data
        while sum(len(kept) for kept in self._prefixes.values()) > self._prefix_cache:
            self._prefixes.popitem(last=False)

    def prompt(self, row: Sequence[int], prefix: int, names: Sequence[str] = ()) -> np.ndarray:
        """Decode ``row`` as sequence 0 (``prefix`` tokens via :meth:`load_prefix`); last logits."""
        if prefix:
            self.load_prefix(row[:prefix])
        return self.decode([], [Row(0, row[prefix:], prefix, [len(row) - 1 - prefix])], names)

    def decode(
        self,
        shared: Sequence[tuple[Sequence[int], Sequence[int]]],
        rows: Sequence[Row],
        names: Sequence[str] = (),
        *,
        shared_at: int = 0,
    ) -> np.ndarray:
        """One ``llama_decode``: shared prefixes, then rows; the logits asked for, in order.

        ``shared``: ``(tokens, seq_ids)`` pairs at positions ``shared_at..`` of all those sequences;
        ``names``: graph tensors to read into :attr:`states` (:meth:`enable_taps` first). Returns
        a ``(n_outputs, n_vocab)`` float32 view of llama.cpp's buffer, not a copy: it holds until
        the next decode, so callers reduce it at once.
        """
        views = self._views
        seq_id = self._batch.seq_id
        n = 0
        wanted = 0
        outputs: list[int] = []
        for tokens, seqs in shared:
            size = len(tokens)
            views["token"][n : n + size] = tokens
            views["pos"][n : n + size] = np.arange(shared_at, shared_at + size)
            views["n_seq_id"][n : n + size] = len(seqs)
            views["logits"][n : n + size] = 0
            for i in range(n, n + size):
                for j, seq in enumerate(seqs):
                    seq_id[i][j] = seq
            n += size
        for row in rows:
            size = len(row.tokens)
            views["token"][n : n + size] = row.tokens
            views["pos"][n : n + size] = np.arange(row.start, row.start + size)
            views["n_seq_id"][n : n + size] = 1
            views["logits"][n : n + size] = 0
            for i in range(n, n + size):
                seq_id[i][0] = row.seq
            for offset in row.outputs:
                views["logits"][n + offset] = 1
                outputs.append(n + offset)
                wanted += 1
            n += size
        if n > self.n_ctx:  # pragma: no cover - callers pack within n_ctx
            msg = f"a decode of {n} tokens exceeds the context's {self.n_ctx} cells"
            raise BackendError(msg)
        self._batch.n_tokens = n
        if names:
            if self._tap is None:  # pragma: no cover - the backend enables taps first
                msg = "hidden states asked of a llama.cpp context made without taps"
                raise BackendError(msg)
            self._tap.arm(names)
        try:
            code = self._lib.llama_decode(self._context.ctx, self._batch)
            self.states = self._tap.take(n, outputs) if names and self._tap and not code else {}
        finally:
            if names and self._tap is not None:
                self._tap.disarm()
        if code != 0:
            msg = f"llama_decode failed (code {code}) on {n} tokens in {len(rows)} rows"
            raise BackendError(msg)
        if not wanted:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        pointer = self._lib.llama_get_logits(self._context.ctx)
        return np.ctypeslib.as_array(pointer, shape=(wanted, self.n_vocab))
