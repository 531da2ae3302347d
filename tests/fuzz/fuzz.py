r"""Random and adversarial inputs through ``ESIGuard``: nothing crashes, hangs or slips through.

    python -m tests.fuzz.fuzz --fake 10000 --model 300 [--seed 0] [--timeout 120]

``--fake N`` inputs go through guards on the in-package ``FakeBackend`` (every failure
policy; backends that fail per item, raise for a whole call, or return NaN), ``--model N``
through a guard on the embedded SmolLM2 model. Inputs: unicode of every plane, control
characters, lone surrogates, zero-width and right-to-left text, empty and whitespace-only
questions, punctuation only, huge questions (past the model's context window), real
questions from ../shared/data, message lists of odd shapes and values that are not
prompts at all.

Each input ends as one of:

* ``scored``: an answer with a finite score and a decision consistent with the threshold;
* ``marked``: ``scored: false`` with a reason, withheld or flagged as the policy says;
* ``refused``: an ``ESIGuardError`` with a message (``InputError`` for what is not a
  prompt; the policy's error with ``on_error="raise"``);
* ``crash`` (any other exception), ``hang`` (no result within ``--timeout`` seconds) or
  ``unmarked`` (an answer that is neither scored nor marked).

Ends with ``fuzz: inputs=N crashes=N hangs=N unmarked=N`` and exits 1 unless the last
three are zero.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import string
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompt_values import ChatPromptValue

from benchmarks.shared_data import SharedDataMissing, shared_data
from esi_guard import ESIGuard, ESIGuardError, FakeBackend, SkipOneChar
from esi_guard.calibration.data import load_examples

ABSTAIN = "I cannot answer that reliably."

# Code point ranges: ASCII, Latin-1 and its controls, combining marks, Greek/Cyrillic,
# Arabic/Hebrew (right to left), CJK, zero-width and bidi controls, emoji, private use,
# lone surrogates, and the last planes.
RANGES = [
    (0x00, 0x1F), (0x20, 0x7E), (0x7F, 0xFF), (0x300, 0x36F), (0x370, 0x4FF), (0x590, 0x6FF),
    (0x4E00, 0x4FFF), (0x200B, 0x200F), (0x202A, 0x202E), (0x2066, 0x2069), (0xFEFF, 0xFEFF),
    (0x1F300, 0x1F6FF), (0xE000, 0xE0FF), (0xD800, 0xDFFF), (0xF0000, 0xF00FF),
]  # fmt: skip


def real_questions(limit: int = 100) -> list[str]:
    """Questions from each shared QA set (a fixed pair when they are not there)."""
    out: list[str] = []
    try:
        data = shared_data()
    except SharedDataMissing:
        data = Path("/nonexistent")
    for path in sorted(data.glob("*/*")):
        if path.suffix in (".jsonl", ".csv") and path.name != "paraphrase.jsonl":
            out += [e.question for e in load_examples(path, limit=limit, seed=0)]
    return out or ["What is the capital of France?", "Which gas do plants absorb?"]


class Inputs:
    """A seeded stream of adversarial guard inputs."""

    def __init__(self, seed: int, *, max_huge: int) -> None:
        self.rng = random.Random(seed)
        self.real = real_questions()
        self.max_huge = max_huge

    def text(self, size: int | None = None) -> str:
        rng = self.rng
        size = rng.choice([1, 3, 10, 40, 200]) if size is None else size
        chars = []
        for _ in range(size):
            low, high = rng.choice(RANGES)
            chars.append(chr(rng.randint(low, high)))
        return "".join(chars)

    def question(self) -> str:
        rng = self.rng
        kind = rng.randrange(12)
        real = rng.choice(self.real)
        if kind == 0:
            return self.text()
        if kind == 1:
            return rng.choice(["", " ", "\n\t ", "\u3000", "\u200b", "\r\n", "\x00", "\u2028"])
        if kind == 2:
            return "".join(rng.choice(string.punctuation) for _ in range(rng.randint(1, 40)))
        if kind == 3:  # huge: past any context window
            return (real + " ") * (self.max_huge // max(len(real), 1) + 1)
        if kind == 4:  # a real question with random characters spliced in
            at = rng.randint(0, len(real))
            return real[:at] + self.text(rng.randint(1, 5)) + real[at:]
        if kind == 5:
            return "".join(rng.choice(string.digits + " +-=?") for _ in range(rng.randint(1, 30)))
        if kind == 6:
            return real.upper() if rng.random() < 0.5 else real[::-1]
        if kind == 7:
            return "\u202e" + real + "\u202c"  # right-to-left override
        if kind == 8:
            return real.replace(" ", rng.choice(["\t", "\u00a0", "\u200b", "  ", "\n"]))
        return real

    def message_list(self) -> Any:
        rng = self.rng
        roles = ["human", "user", "system", "ai", "assistant", "tool", "function", "", "bot"]
        items: list[Any] = []
        for _ in range(rng.choice([0, 1, 2, 3, 8])):
            shape = rng.randrange(9)
            content: Any = self.question()
            if shape == 0:
                items.append((rng.choice(roles), content))
            elif shape == 1:
                items.append({"role": rng.choice(roles), "content": content})
            elif shape == 2:
                items.append(HumanMessage(content))
            elif shape == 3:
                items.append(SystemMessage(content))
            elif shape == 4:
                items.append(AIMessage(content))
            elif shape == 5:
                items.append(ToolMessage(content, tool_call_id="call-1"))
            elif shape == 6:  # content blocks, sometimes not text
                image = {"type": "image_url", "image_url": {"url": "x"}}
                block = rng.choice([{"type": "text", "text": content}, image, content])
                items.append(HumanMessage(content=[block]))
            elif shape == 7:  # shapes that are wrong
                wrong = [(content,), ("human",), {"content": content}, None, 7,
                         ["human", content, "extra"], {"role": "human"}]  # fmt: skip
                items.append(rng.choice(wrong))
            else:
                items.append(content)
        if rng.random() < 0.2:
            return ChatPromptValue(messages=[m for m in items if isinstance(m, HumanMessage)])
        return items

    def __iter__(self) -> Iterator[Any]:
        rng = self.rng
        while True:
            roll = rng.random()
            if roll < 0.6:
                yield self.question()
            elif roll < 0.95:
                yield self.message_list()
            else:
                yield rng.choice([None, 42, 3.5, b"bytes?", {"question": "x"}, set(), object(),
                                  [[["nested"]]], ("human", "a tuple, not a list")])  # fmt: skip


def outcome(result: Any) -> str:
    """``scored``, ``marked``, ``refused``, ``crash`` or ``unmarked`` (see the docstring)."""
    if isinstance(result, ESIGuardError):
        return "refused" if str(result) else "unmarked"
    if isinstance(result, BaseException):
        return "crash"
    if not isinstance(result, AIMessage):
        return "unmarked"
    esi = result.response_metadata.get("esi")
    if not isinstance(esi, dict):
        return "unmarked"
    json.dumps(esi)  # metadata must stay serialisable: raising here is a crash
    score = esi.get("score")
    if esi.get("scored") is True and isinstance(score, float) and math.isfinite(score):
        consistent = (score <= esi["threshold"]) == (esi["decision"] == "accept")
        return "scored" if consistent else "unmarked"
    if esi.get("scored") is False and score is None and esi.get("reason"):
        if esi["decision"] == "abstain" and result.content == ABSTAIN:
            return "marked"
        if esi["decision"] == "flag" and result.content == esi["answer"]:
            return "marked"
    return "unmarked"


class BrokenBackend(FakeBackend):
    """Its whole teacher-forcing call raises, as a crashed engine would."""

    def teacher_force(self, requests: Any, *, top_k: int) -> Any:
        raise RuntimeError("engine crashed mid-pass")


def fake_guards() -> list[tuple[ESIGuard, FakeBackend]]:
    """Guards on fake backends: every policy, failing and sound engines."""
    guards = []
    for on_error in ("abstain", "flag", "raise"):
        for backend in (FakeBackend(default_sensitivity=0.5), BrokenBackend()):
            guard = ESIGuard(backend=backend, threshold=0.1, on_error=on_error, action="abstain",
                             abstain_message=ABSTAIN, n_variants=4, top_k=20)  # fmt: skip
            guards.append((guard, backend))
    return guards


class Tally:
    """Counts of outcomes, with the first few failures kept for the report."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.examples: list[str] = []

    def add(self, kind: str, value: Any, detail: str) -> None:
        self.counts[kind] += 1
        if kind in ("crash", "hang", "unmarked") and len(self.examples) < 10:
            self.examples.append(f"{kind}: {value!r:.200} -> {detail:.800}")


def run_calls(
    calls: Iterator[tuple[list[Any], Callable[[], list[Any]]]], tally: Tally, timeout: float
) -> None:
    """Run each batch of inputs under a watchdog; a batch past ``timeout`` is a hang."""
    pool = ThreadPoolExecutor(max_workers=1)
    for values, call in calls:
        future = pool.submit(call)
        try:
            results = future.result(timeout=timeout)
        except FutureTimeout:
            for value in values:
                tally.add("hang", value, f"no result in {timeout} s")
            pool.shutdown(wait=False)  # the stuck thread is left behind; go on with a new one
            pool = ThreadPoolExecutor(max_workers=1)
            continue
        except BaseException as exc:
            results = [exc] * len(values)
        for value, result in zip(values, results, strict=True):
            try:
                kind = outcome(result)
            except Exception as exc:  # a metadata dict json cannot write
                kind, result = "crash", exc
            crashed = kind == "crash"
            detail = "".join(traceback.format_exception(result)) if crashed else repr(result)
            tally.add(kind, value, detail)
    pool.shutdown(wait=False)


def invoke_one(guard: ESIGuard, value: Any) -> Callable[[], list[Any]]:
    def call() -> list[Any]:
        try:
            return [guard.invoke(value)]
        except ESIGuardError as exc:
            return [exc]

    return call


def fuzz_fake(count: int, seed: int, timeout: float, tally: Tally) -> None:
    """``count`` inputs through the fake-backend guards, by invoke and by batch."""
    guards = fake_guards()
    stream = iter(Inputs(seed, max_huge=200_000))
    rng = random.Random(seed + 1)

    def calls() -> Iterator[tuple[list[Any], Callable[[], list[Any]]]]:
        done = 0
        while done < count:
            guard, backend = rng.choice(guards)
            backend.failures.clear()
            size = min(rng.choice([1, 1, 1, 5]), count - done)
            values = [next(stream) for _ in range(size)]
            for value in values:  # some questions fail in one step of the engine
                if isinstance(value, str) and rng.random() < 0.1:
                    backend.failures[value] = rng.choice(["generate", "teacher_force", "nan"])
            done += size
            if size == 1:
                yield values, invoke_one(guard, values[0])
            else:
                yield values, lambda g=guard, v=values: g.batch(v, return_exceptions=True)

    run_calls(calls(), tally, timeout)


def fuzz_model(count: int, seed: int, timeout: float, tally: Tally) -> None:
    """``count`` inputs through a guard on the embedded model, in batches of 10."""
    from esi_guard import HFBackend

    backend = HFBackend.default(device="cpu")
    guard = ESIGuard(backend=backend, threshold=0.3, action="abstain", abstain_message=ABSTAIN,
                     max_new_tokens=8, intervention=SkipOneChar())  # fmt: skip
    # Questions at most a few hundred characters, or far past the 8192-token window
    # (refused before any forward pass); anything between would only be slow on a CPU.
    source = Inputs(seed, max_huge=60_000)
    stream = (v for v in source if not (isinstance(v, str) and 400 < len(v) < 40_000))

    def calls() -> Iterator[tuple[list[Any], Callable[[], list[Any]]]]:
        for start in range(0, count, 10):
            values = [next(stream) for _ in range(min(10, count - start))]
            yield values, lambda v=values: guard.batch(v, return_exceptions=True)

    run_calls(calls(), tally, timeout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fake", type=int, default=10_000, help="inputs on the fake backend")
    parser.add_argument("--model", type=int, default=300, help="inputs on the embedded model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per call")
    args = parser.parse_args()

    tally = Tally()
    for name, count, run in (("fake", args.fake, fuzz_fake), ("model", args.model, fuzz_model)):
        if count:
            start = time.perf_counter()
            before = Counter(tally.counts)
            run(count, args.seed, args.timeout, tally)
            seen = dict(tally.counts - before)
            print(f"{name}: {count} inputs in {time.perf_counter() - start:.0f} s: {seen}")
    for line in tally.examples:
        print(line, file=sys.stderr)
    c = tally.counts
    inputs = sum(c.values())
    print(f"fuzz: inputs={inputs} crashes={c['crash']} hangs={c['hang']} unmarked={c['unmarked']}")
    return 1 if c["crash"] or c["hang"] or c["unmarked"] else 0


if __name__ == "__main__":
    sys.exit(main())
