"""Scores per sentence: the splitter's spans, tokens to sentences, each sentence's numbers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from esi_guard.sentences import SentenceScore, score_sentences, split_sentences, token_sentences

ROOT = Path(__file__).resolve().parents[2]


def _words(text: str) -> list[int]:
    """End offsets of whitespace-led word tokens, as a BPE tokenizer cuts " word"."""
    ends, at = [], 0
    for word in text.split(" "):
        at += len(word) + (1 if ends else 0)
        ends.append(at)
    return ends


def test_spans_partition_the_text_and_keep_the_space_after_each_sentence() -> None:
    text = "Paris is the capital of France. Dr. Smith was born in 1950.  Is it big? Yes"
    spans = split_sentences(text)
    texts = [text[start:end] for start, end in spans]
    assert "".join(texts) == text
    assert texts == ["Paris is the capital of France. ", "Dr. Smith was born in 1950.  ",
                     "Is it big? ", "Yes"]  # fmt: skip
    assert [end for _, end in spans[:-1]] == [start for start, _ in spans[1:]]


def test_numbered_answers_are_one_sentence_each() -> None:
    text = "1. Paris is the capital.\n2. Water boils at 100 degrees.\n3. Sugar."
    assert [text[a:b].strip() for a, b in split_sentences(text)] == [
        "1. Paris is the capital.", "2. Water boils at 100 degrees.", "3. Sugar."
    ]  # fmt: skip


def test_an_empty_answer_has_no_sentence() -> None:
    assert split_sentences("") == []
    assert split_sentences("   \n") == []


def test_a_token_belongs_to_the_sentence_of_its_first_letter() -> None:
    text = "It is red. It is big."
    spans = split_sentences(text)
    ends = _words(text)  # "It"," is"," red."," It"," is"," big."
    assert token_sentences(text, spans, ends) == [(0, 3), (3, 6)]


def test_each_sentence_is_scored_on_its_own_tokens() -> None:
    text = "It is red. It is big."
    scores = [0.1, 0.2, 0.3, 1.0, 2.0, 3.0]
    logprobs = [-0.1, -0.2, -0.3, -1.0, -2.0, -4.0]
    entropies = [1.0, 1.0, 1.0, 2.0, 2.0, 5.0]
    first, second = score_sentences(text, _words(text), scores, logprobs, entropies)
    assert (first.text, first.start, first.end) == ("It is red. ", 0, 11)
    assert (second.text, second.first_token, second.end_token) == ("It is big.", 3, 6)
    assert first.score == pytest.approx(0.2)
    assert second.score == pytest.approx(2.0)
    # The whole answer's ESI is the token mean: the sentences' token-weighted mean.
    assert np.mean(scores) == pytest.approx((3 * first.score + 3 * second.score) / 6)
    assert second.signals == pytest.approx({"nll": 7.0, "entropy": 3.0, "max_nll": 4.0})
    assert first.decision == "accept" and first.p_wrong is None


def test_a_sentence_without_a_token_of_its_own_joins_the_one_before() -> None:
    text = "Yes. No. Maybe so."
    # One token covers "Yes. No. " whole: the second sentence has no token of its own.
    ends = [9, 15, 18]
    sentences = score_sentences(text, ends, [1.0, 2.0, 3.0], [-1.0] * 3, [1.0] * 3)
    assert [s.text for s in sentences] == ["Yes. No. ", "Maybe so."]
    assert [(s.first_token, s.end_token) for s in sentences] == [(0, 1), (1, 3)]
    assert "".join(s.text for s in sentences) == text


def test_mismatched_arrays_are_refused_with_their_lengths() -> None:
    with pytest.raises(ValueError, match="3 offsets, 2 scores"):
        score_sentences("A b c.", [1, 3, 6], [0.1, 0.2], [0.0] * 3, [0.0] * 3)


def test_as_dict_names_the_metadata_keys() -> None:
    sentence = SentenceScore("A.", 0, 2, 0, 1, 0.5, {"nll": 1.0}, "redact", p_wrong=0.7)
    assert sentence.as_dict() == {
        "text": "A.", "start": 0, "end": 2, "score": 0.5, "decision": "redact",
        "signals": {"nll": 1.0}, "first_token": 0, "end_token": 1, "p_wrong": 0.7,
    }  # fmt: skip
    assert "p_wrong" not in SentenceScore("A.", 0, 2, 0, 1, 0.5).as_dict()


def test_sentences_split_where_pysbd_is_compiled_at_import_under_warnings_as_errors(
    tmp_path: Path,
) -> None:
    """pysbd's invalid escapes warn when its files compile (no bytecode shipped, Python 3.12
    warns louder): under ``-W error`` that was a SyntaxError inside the guard (seen on the
    GPU machine, whose packages were installed with --no-compile)."""
    import shutil
    import subprocess
    import sys

    import pysbd

    shutil.copytree(Path(pysbd.__file__).parent, tmp_path / "pysbd",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    code = "from esi_guard.sentences import split_sentences; print(split_sentences('A b. C d.'))"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}  # fmt: skip
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[(0, 5), (5, 9)]"
