"""ESI from the top-k logprobs of OpenAI-compatible servers (OpenAI, vLLM, llama.cpp...).

* **echo** (exact): the completions endpoint with ``echo=True`` and ``logprobs=k`` on each
  variant's prompt plus the answer: true teacher forcing. Needs the model's chat template and a
  server that still offers echo.
* **chat** (approximate): the answer's ``top_logprobs`` and, per variant, a greedy regeneration.
  Positions up to the first disagreement are exact; later ones score the distance's upper bound
  (1 for Hellinger). Results say ``approximate: true``.

``mode="auto"`` probes the server once; so does ``echo_alignment="auto"``, as servers disagree on
where echo logprobs sit. APIs return token strings: each gets an id for the backend's lifetime.
Failures: 429, 5xx, timeouts and connection errors are retried with exponential jitter
(``max_retries``; other 4xx are not), then that prompt gets an :class:`~esi_guard.APIError` in
place (so does a malformed response: never a NaN score) and the rest of the batch keeps theirs.
The API key lives only in the SDK clients: never in ``repr``, metadata, logs or callbacks.
"""

from esi_guard.backends.openai._transport import RequestStats
from esi_guard.backends.openai.backend import OpenAIBackend

__all__ = ["OpenAIBackend", "RequestStats"]
