"""A local NLI or cross-encoder model for the semantic baselines, at their papers' strength.

Semantic entropy clusters answers that entail each other both ways (Farquhar et al. 2024,
DeBERTa-MNLI); SAR weighs tokens and sentences by a cross-encoder's relevance (Duan et
al. 2024). Any local transformers sequence-classification model serves:

* an NLI model (labels include one named like ``entailment``): a pair scores its
  probability of entailment, and two answers are equivalent when each is predicted to
  entail the other (the label with the highest probability, both ways);
* a cross-encoder with one output (STS-style): a pair scores the sigmoid of its logit,
  and two answers are equivalent when both directions score >= 0.5.

Without one, the benchmarks keep the packaged MiniLM embeddings and say so. Needs the
``hf`` extra; nothing is downloaded: pass a local folder (or a hub id already cached).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from esi_guard.exceptions import ConfigurationError

__all__ = ["NLIModel"]


class NLIModel:
    """Pair scores, an equivalence matrix and a relevance matrix from one local model."""

    def __init__(self, path: str | Path, *, device: str = "cpu", batch_size: int = 32) -> None:
        """Load the tokenizer and model from ``path`` (a local folder or cached hub id).

        Raises:
            ConfigurationError: transformers missing, the model not loadable, or an
                NLI-sized head without an entailment label.
        """
        try:
            import torch
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError as exc:
            msg = "an NLI model needs transformers and torch: pip install 'esi-guard[hf]'"
            raise ConfigurationError(msg) from exc
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
            self.model = AutoModelForSequenceClassification.from_pretrained(str(path))
        except (OSError, ValueError) as exc:
            msg = f"cannot load a sequence-classification model from {path}: {exc}"
            raise ConfigurationError(msg) from exc
        self.model.to(device).eval()
        self._torch: Any = torch
        self.device = device
        self.batch_size = batch_size
        self.name = str(path)
        self._last: tuple[tuple[str, ...], tuple[np.ndarray, np.ndarray]] | None = None
        labels = {int(i): str(name).lower() for i, name in self.model.config.id2label.items()}
        self.entailment: int | None = None
        if self.model.config.num_labels > 1:
            found = [i for i, name in labels.items() if "entail" in name]
            if not found:
                msg = (
                    f"{path} has labels {sorted(labels.values())} and none names entailment: "
                    "give an NLI model, or a cross-encoder with one output"
                )
                raise ConfigurationError(msg)
            self.entailment = found[0]

    def _logits(self, firsts: Sequence[str], seconds: Sequence[str]) -> np.ndarray:
        out = []
        for start in range(0, len(firsts), self.batch_size):
            batch = self.tokenizer(
                list(firsts[start : start + self.batch_size]),
                list(seconds[start : start + self.batch_size]),
                padding=True, truncation=True, return_tensors="pt",
            ).to(self.device)  # fmt: skip
            with self._torch.no_grad():
                out.append(self.model(**batch).logits.float().cpu().numpy())
        return np.concatenate(out) if out else np.zeros((0, self.model.config.num_labels))

    def pair_scores(self, firsts: Sequence[str], seconds: Sequence[str]) -> np.ndarray:
        """For each pair, P(first entails second), or the cross-encoder's sigmoid score."""
        return self._scores(self._logits(firsts, seconds))

    def _scores(self, logits: np.ndarray) -> np.ndarray:
        if self.entailment is None:
            return np.asarray(1.0 / (1.0 + np.exp(-logits[:, 0])), dtype=np.float64)
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        return np.asarray(shifted[:, self.entailment] / shifted.sum(axis=1), dtype=np.float64)

    def _both_ways(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Pair scores and entailment of every ordered pair of ``texts``.

        The last texts' are kept: ``equivalence`` and ``relevance`` of the same samples
        run the model once.
        """
        key = tuple(texts)
        if self._last is not None and self._last[0] == key:
            return self._last[1]
        result = self._score_all(texts)
        self._last = (key, result)
        return result

    def _score_all(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        n = len(texts)
        grid = [(i, j) for i in range(n) for j in range(n) if i != j]
        logits = self._logits([texts[i] for i, _ in grid], [texts[j] for _, j in grid])
        scores = self._scores(logits)
        score, entails = np.eye(n), np.eye(n, dtype=bool)
        for (i, j), value, row in zip(grid, scores, logits, strict=True):
            score[i, j] = value
            entails[i, j] = value >= 0.5 if self.entailment is None else (
                int(np.argmax(row)) == self.entailment)  # fmt: skip
        return score, entails

    def equivalence(self, texts: Sequence[str]) -> np.ndarray:
        """1 where two texts entail each other both ways, else 0 (n x n, symmetric).

        A :data:`~benchmarks.baselines.Similarity` for ``semantic_entropy(..., threshold=0.5)``.
        """
        _, entails = self._both_ways(texts)
        return np.asarray(entails & entails.T, dtype=np.float64)

    def relevance(self, texts: Sequence[str]) -> np.ndarray:
        """The mean of the two directions' pair scores (n x n, symmetric, 1 on the diagonal).

        A :data:`~benchmarks.baselines.Similarity` for ``sentence_sar`` and ``sar``.
        """
        score, _ = self._both_ways(texts)
        return np.asarray((score + score.T) / 2, dtype=np.float64)
