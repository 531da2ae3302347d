"""ESI from the top-k logprobs of OpenAI-compatible servers (OpenAI, vLLM, llama.cpp...).

Two ways to get the variants' distributions:

* **echo** (exact): the completions endpoint with ``echo=True`` and ``logprobs=k`` on the
  variant's prompt followed by the answer. The server scores the prompt it was sent, so the
  top-k at each answer position is true teacher forcing. Needs the model's chat template
  (to render the prompt as the model saw it) and a server that still offers echo.
* **chat** (approximate): the answer's own ``top_logprobs`` from the chat endpoint, and for
  each variant a greedy regeneration with ``top_logprobs``. While the variant's tokens agree
  with the answer's, the prefixes are the same, so each position up to and including the
  first disagreement is exact. After it the variant has left the answer: those positions
  score the distance's upper bound (1 for Hellinger), the most a distribution can move.
  Results say ``approximate: true``.

``mode="auto"`` probes the server once (an echo request) and remembers the answer.

Servers do not agree on where echo logprobs sit. OpenAI and vLLM put at entry ``i`` the
distribution that predicted token ``i`` (``echo_alignment="same"``); llama-cpp-python
0.3.x, on a prompt that does not start with its BOS token, puts there the distribution
*after* token ``i``, which predicts token ``i + 1`` (``"next"``). ``"auto"`` finds out once
per backend: it lets the server continue a counting prompt greedily, echoes it, and checks
which layout makes each greedy token the top-1 of its own distribution.

Token ids: APIs return token strings, so the backend gives each distinct string an id of
its own (consistent for the backend's lifetime). ESI only compares distributions at the
same position, so that is all it needs.

Failures: 429, 5xx, timeouts and connection errors are retried with exponential jitter
(tenacity, ``max_retries``); other 4xx are not. After that the request's prompt gets an
:class:`~esi_guard.APIError` (``retryable``, ``status_code``, ``original``) in place of its
result, and the rest of the batch keeps theirs. A response without logprobs, with fewer
positions than the answer or otherwise malformed is an ``APIError`` too, never a NaN score.
The API key lives only in the SDK clients: never in ``repr``, metadata, logs or callbacks.

Modules: ``backend`` (the class), ``_wire`` (request arguments and response parsing),
``_transport`` (clients, retries, concurrency, errors) and ``_negotiate`` (settling the
mode and the echo layout).
"""

from esi_guard.backends.openai._transport import RequestStats
from esi_guard.backends.openai.backend import OpenAIBackend

__all__ = ["OpenAIBackend", "RequestStats"]
