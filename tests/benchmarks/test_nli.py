"""NLI / cross-encoder scores for the semantic baselines, and SAR with token relevance."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from benchmarks.baselines import sar, semantic_entropy, sentence_sar
from esi_guard import ConfigurationError
from esi_guard.backends.sampling import Sample
from esi_guard.exceptions import ScoringError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from benchmarks.nli import NLIModel  # noqa: E402

WORDS = ["paris", "lyon", "is", "the", "capital", "it", "city"]


def tiny_model(path: Path, labels: dict[int, str]) -> Path:
    """A random 1-layer BERT classifier and its word-piece vocabulary, saved to ``path``."""
    torch.manual_seed(0)
    (path / "vocab.txt").parent.mkdir(parents=True, exist_ok=True)
    (path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])
    )
    tokenizer = transformers.BertTokenizer(str(path / "vocab.txt"))
    config = transformers.BertConfig(
        vocab_size=5 + len(WORDS), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=len(labels), id2label=labels,
        label2id={v: k for k, v in labels.items()},
    )  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


NLI_LABELS = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}


def test_a_local_nli_model_loads_and_scores_pairs(tmp_path: Path) -> None:
    model = NLIModel(tiny_model(tmp_path / "nli", NLI_LABELS))
    assert model.entailment == 2
    scores = model.pair_scores(["paris is the capital", "lyon"], ["it is paris", "paris"])
    assert scores.shape == (2,) and ((scores > 0) & (scores < 1)).all()
    texts = ["paris", "it is paris", "lyon"]
    for matrix in (model.equivalence(texts), model.relevance(texts)):
        assert matrix.shape == (3, 3) and np.allclose(matrix, matrix.T)
        assert np.allclose(np.diag(matrix), 1.0)


def test_equivalence_needs_entailment_both_ways(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    model = NLIModel(tiny_model(tmp_path / "nli", NLI_LABELS))
    entail, neutral = [0.0, 0.0, 5.0], [0.0, 5.0, 0.0]

    def scripted(firsts: Sequence[str], seconds: Sequence[str]) -> np.ndarray:
        # "Paris" and "the capital is Paris" entail each other; "Paris" -> "a city" only.
        both = {("Paris", "the capital is Paris"), ("the capital is Paris", "Paris"),
                ("Paris", "a city")}  # fmt: skip
        pairs = zip(firsts, seconds, strict=True)
        return np.array([entail if pair in both else neutral for pair in pairs])

    monkeypatch.setattr(model, "_logits", scripted)
    texts = ["Paris", "the capital is Paris", "a city"]
    assert model.equivalence(texts).tolist() == [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    calls = []
    monkeypatch.setattr(model, "_logits", lambda *a: calls.append(a) or scripted(*a))
    model.relevance(texts)  # the same samples again: the model is not run twice
    assert calls == []
    samples = [Sample(t, (-0.1,)) for t in texts]
    # Two meanings, not three: the NLI clusters decide semantic entropy.
    two = semantic_entropy(samples, model.equivalence, 0.5)
    three = semantic_entropy(samples, lambda t: np.eye(len(t)), 0.5)
    assert two < three


def test_a_cross_encoder_scores_with_a_sigmoid_and_other_heads_are_refused(tmp_path: Path) -> None:
    model = NLIModel(tiny_model(tmp_path / "ce", {0: "LABEL_0"}))
    assert model.entailment is None
    logits = model._logits(["paris"], ["lyon"])
    assert model.pair_scores(["paris"], ["lyon"])[0] == pytest.approx(
        1 / (1 + math.exp(-logits[0, 0]))
    )
    with pytest.raises(ConfigurationError, match="none names entailment"):
        NLIModel(tiny_model(tmp_path / "sentiment", {0: "negative", 1: "positive"}))
    with pytest.raises(ConfigurationError, match="cannot load"):
        NLIModel(tmp_path / "nowhere")


def sample(tokens: list[str], logprobs: list[float]) -> Sample:
    return Sample("".join(tokens).strip(), tuple(logprobs), tuple(tokens))


def test_sar_with_equal_token_relevance_is_sentence_sar() -> None:
    samples = [sample([" Paris", "."], [-0.2, -0.4]), sample([" Lyon", "."], [-1.5, -0.1])]

    def flat(texts: Sequence[str]) -> np.ndarray:
        return np.full((len(texts), len(texts)), 0.5)

    assert sar(samples, flat) == pytest.approx(sentence_sar(samples, flat))


def test_sar_weighs_the_tokens_the_meaning_rests_on() -> None:
    # The answer's meaning rests on " Paris": an unsure " Paris" makes it less likely.
    def pairs(firsts: Sequence[str], seconds: Sequence[str]) -> np.ndarray:
        return np.array([0.1 if "Paris" not in b else 0.95 for b in seconds])

    sure = [sample([" Paris", " it", " is", "."], [-0.05, -1.0, -1.0, -2.0])] * 3
    unsure = [sample([" Paris", " it", " is", "."], [-2.0, -0.05, -1.0, -1.0])] * 3
    flat = sentence_sar(sure, lambda t: np.eye(len(t)))
    assert flat == pytest.approx(sentence_sar(unsure, lambda t: np.eye(len(t))))  # same mean
    assert sar(sure, lambda t: np.eye(len(t)), pairs=pairs) < sar(
        unsure, lambda t: np.eye(len(t)), pairs=pairs
    )
    with pytest.raises(ScoringError, match="token texts"):
        sar([Sample("Paris", (-0.1,))], lambda t: np.eye(len(t)))
