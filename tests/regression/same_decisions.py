"""The guard's scores and decisions on 20 SciQ questions, recorded or compared with a record.

A check for changes that must not change behaviour (moving modules, rewriting the step
order): record before, compare after. It runs the embedded default guard (its shipped
threshold) through every way a user calls it: ``invoke``, ``batch``, ``stream`` (held),
``ainvoke``/``abatch``, ``score`` on the greedy answers, one ``abstain`` and one ``route``,
and records the child runs each traced call reports (their tags, in order)::

    python -m tests.regression.same_decisions --record before.json
    # ... the change ...
    python -m tests.regression.same_decisions --compare before.json

``--server`` records ``esi-guard serve``'s responses instead (in memory, the same guard):
plain, streamed, sized and stopped requests, an answer that cannot be scored, an
abstaining, a routing and a live-streaming server, and the errors a client can cause
(status, body and ``X-ESI-*`` headers; ids and times left out).

``--compare`` exits 1 and names every difference; scores are compared exactly (the same
code on the same engine is bit-reproducible).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableLambda

from benchmarks.shared_data import shared_data
from esi_guard import ESIGuard

_KEYS = ("score", "decision", "scored", "reason", "answer", "variants", "variants_used",
         "token_scores", "signals", "p_wrong", "fallback_used")  # fmt: skip
"""What is compared of each answer's ``response_metadata["esi"]``, besides its content."""


class _Steps(BaseCallbackHandler):
    """The tags of the child runs a call reports, in the order they start."""

    def __init__(self) -> None:
        self.tags: list[str] = []

    def on_chain_start(self, serialized: Any, inputs: Any, *, run_id: UUID, **kw: Any) -> None:
        self.tags.extend(tag for tag in kw.get("tags") or [] if tag.startswith("esi:"))


def _esi(message: Any) -> dict[str, Any]:
    esi = dict(message.response_metadata["esi"])
    return {"content": message.content, **{k: esi.get(k) for k in _KEYS}}


def record(n: int) -> dict[str, Any]:
    """Everything the check compares, as JSON-friendly values."""
    data = shared_data() / "sciq" / "test.jsonl"
    lines = data.read_text(encoding="utf-8").splitlines()[:n]
    questions = [json.loads(line)["query"] for line in lines]
    guard = ESIGuard()
    out: dict[str, Any] = {"threshold": guard.threshold, "model": guard.backend.model_id}
    steps = _Steps()
    out["invoke"] = [_esi(guard.invoke(q, {"callbacks": [steps]})) for q in questions]
    out["invoke_steps"] = steps.tags
    steps = _Steps()
    out["batch"] = [_esi(m) for m in guard.batch(questions, {"callbacks": [steps]})]
    out["batch_steps"] = steps.tags
    out["stream"] = [_esi(list(guard.stream(q))[-1]) for q in questions]
    out["ainvoke"] = [_esi(asyncio.run(guard.ainvoke(q))) for q in questions[:3]]
    out["abatch"] = [_esi(m) for m in asyncio.run(guard.abatch(questions[:5]))]
    scored = [guard.score(q, r["answer"]) for q, r in zip(questions, out["invoke"], strict=True)]
    out["score"] = [{"score": r.score, "decision": r.decision, "reason": r.reason} for r in scored]
    worst = max(range(n), key=lambda i: out["invoke"][i]["score"] or 0.0)
    untrusted = questions[worst]
    abstaining = ESIGuard(action="abstain", abstain_message="no answer")
    out["abstain"] = _esi(abstaining.invoke(untrusted))
    fallback = RunnableLambda(lambda _: AIMessage(content="from the fallback"))
    routing = ESIGuard(action="route", fallback=fallback)
    steps = _Steps()
    out["route"] = _esi(routing.invoke(untrusted, {"callbacks": [steps]}))
    out["route_steps"] = steps.tags
    return out


_REQUESTS: list[tuple[str, dict[str, Any]]] = [
    ("plain", {}),
    ("sized", {"max_tokens": 5}),
    ("stopped", {"stop": ["."]}),
    ("streamed", {"stream": True}),
    ("sampled", {"temperature": 0.7, "seed": 3}),
]
_UNSCORABLE = "Go on, do it."
"""A question with no word Skip-One-Char can edit: its answer cannot be scored."""
_BAD: list[tuple[str, dict[str, Any]]] = [
    ("unknown model", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    ("no messages", {"model": "default", "messages": []}),
    ("n=2", {"model": "default", "n": 2, "messages": [{"role": "user", "content": "hi"}]}),
    ("too long", {"model": "default", "messages": [{"role": "user", "content": "word " * 10000}]}),
]


def _response(response: Any) -> dict[str, Any]:
    """Status, ``X-ESI-*`` headers and body of a response, without ids and times."""
    headers = {k: v for k, v in sorted(response.headers.items()) if k.startswith("x-esi")}
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in response.text.splitlines()
                  if line.startswith("data: ")]  # fmt: skip
        body: Any = [json.loads(e) if e != "[DONE]" else e for e in events]
    else:
        body = response.json()
    return {"status": response.status_code, "headers": headers, "body": _timeless(body)}


_TIMES = ("id", "created", "system_fingerprint", "timings", "seconds")
"""What differs between two runs of the same request."""


def _timeless(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k not in _TIMES}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def record_server(n: int) -> dict[str, Any]:
    """``esi-guard serve``'s responses to the same questions, for the same guards."""
    from tests.unit.server.servers import client

    data = shared_data() / "sciq" / "test.jsonl"
    lines = data.read_text(encoding="utf-8").splitlines()[:n]
    questions = [json.loads(line)["query"] for line in lines]
    fallback = RunnableLambda(lambda _: AIMessage(content="from the fallback"))
    guards = {  # one thread: scores do not depend on it, and two recorders share the cores
        "flag": ESIGuard(n_threads=1),
        "abstain": ESIGuard(
            action="abstain", abstain_message="no answer", threshold=0.05, n_threads=1
        ),
        "route": ESIGuard(action="route", fallback=fallback, threshold=0.05, n_threads=1),
        "live": ESIGuard(on_error="flag", n_threads=1),  # streams show tokens as generated
    }

    async def ask(guard: ESIGuard) -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with client(guard, model_name="default") as c:
            for i, question in enumerate(questions):
                name, extra = _REQUESTS[i % len(_REQUESTS)]
                body = {"model": "default", "messages": [{"role": "user", "content": question}],
                        **extra}  # fmt: skip
                out[f"{i}:{name}"] = _response(await c.post("/v1/chat/completions", json=body))
            for name, body in _BAD:
                out[name] = _response(await c.post("/v1/chat/completions", json=body))
            for stream in (False, True):  # no word long enough to edit: no variant differs
                body = {"model": "default", "messages": [{"role": "user", "content": _UNSCORABLE}],
                        "stream": stream}  # fmt: skip
                out[f"unscorable, stream={stream}"] = _response(
                    await c.post("/v1/chat/completions", json=body)
                )
        return out

    return {name: asyncio.run(ask(guard)) for name, guard in guards.items()}


def differences(before: Any, after: Any, where: str = "") -> list[str]:
    """Every place where ``after`` differs from ``before`` (exact)."""
    if isinstance(before, dict) and isinstance(after, dict):
        keys = sorted(set(before) | set(after))
        return [d for k in keys for d in differences(before.get(k), after.get(k), f"{where}.{k}")]
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [d for i, (b, a) in enumerate(zip(before, after, strict=True))
                for d in differences(b, a, f"{where}[{i}]")]  # fmt: skip
    return [] if before == after else [f"{where}: {before!r} -> {after!r}"]


def main() -> int:
    """Record or compare; 1 when the comparison finds a difference."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, help="write the record here")
    mode.add_argument("--compare", type=Path, help="compare with this record")
    parser.add_argument("--n", type=int, default=20, help="questions (default 20)")
    parser.add_argument("--server", action="store_true", help="record the server's responses")
    args = parser.parse_args()
    now = json.loads(json.dumps((record_server if args.server else record)(args.n)))
    if args.record:
        args.record.write_text(json.dumps(now, indent=1), encoding="utf-8")
        print(f"recorded {args.n} questions to {args.record}")
        return 0
    found = differences(json.loads(args.compare.read_text(encoding="utf-8")), now)
    for line in found:
        print(line)
    if args.server:
        print(f"same_decisions --server: questions={args.n} differences={len(found)}")
        return 1 if found else 0
    decisions = [r["decision"] for r in now["invoke"]]
    print(f"same_decisions: questions={args.n} differences={len(found)} "
          f"accepted={decisions.count('accept')} flagged={decisions.count('flag')}")  # fmt: skip
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
