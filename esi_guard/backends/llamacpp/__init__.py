"""llama.cpp in process: ESI on a GGUF file through llama-cpp-python, fast on CPUs.

White-box like :class:`~esi_guard.HFBackend`: the values are the model's raw logits, and
only the top-k of each answer position is kept (numpy ``argpartition`` on the logits row).
The backend runs on a llama.cpp context of its own made from the ``Llama``'s loaded model:
the weights are shared, and the ``Llama``'s own context (the one LangChain's
``ChatLlamaCpp`` generates with) is never touched.

Rows packed, or each alone (``pack_rows``): a request's rows (the original, then each
variant) go into one ``llama_decode`` after the prompt prefix they share, computed once
and its KV cells shared with each row (no copy, no recomputation); more rows than
``n_seq_max`` or ``n_ctx`` holds are split over several decodes (:mod:`._pack`).
llama.cpp's CPU kernels round a token's numbers differently with the size of the decode
it falls in, by up to about two logits on the embedded model, so packed rows differ from
rows decoded alone by that much; a request's rows never share a decode with another
request's, so a request gets the same bits whatever it is batched with.
``pack_rows=False`` decodes every row alone: generation and teacher forcing of a short
prompt then agree to the bit. Either way the ESI scores follow transformers'
(``python -m benchmarks.timing engines``: Spearman 0.99 where the greedy answers match).
Sampling (for the baselines only) decodes its ``n`` answers together.

Forcing precision (``forcing_precision``): a small quantized model on the CPU forces on a
float16 copy of its weights (:mod:`._copy`), twice as fast there as llama.cpp's quantized
kernels, while generation stays on the file's weights; the engine is then
``llamacpp-f16`` (``llamacpp-f32`` on a float32 copy).

``backend.py`` is the backend (greedy answers, teacher forcing, sampling); ``_chat.py``
picks its chat template; ``_decoding.py`` runs the token-by-token loops and
``_generation.py`` greedy answers over them; ``_engine.py`` is the context of its own,
the batch it decodes and the top-k of logits; ``_pack.py`` puts a request's forced rows
into few decodes; ``_copy.py`` makes the float16 (or float32) copy forcing runs on;
``_tap.py`` reads hidden states; ``_loading.py`` loads a ``Llama`` safe to decode on this
CPU (:func:`load_llama`, and the file :meth:`LlamaCppBackend.from_path` opens;
``_cpu.py`` reads the CPU and what llama.cpp was built for).
Importing this package does not import llama-cpp-python.
"""

from esi_guard.backends.llamacpp._loading import load_llama
from esi_guard.backends.llamacpp.backend import COMPLETION_TEMPLATE, LlamaCppBackend

__all__ = ["COMPLETION_TEMPLATE", "LlamaCppBackend", "load_llama"]
