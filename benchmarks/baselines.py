"""Baseline uncertainty scores ESI is compared with, as pure functions of samples.

Every score is an *uncertainty*: higher means "less likely right", like ESI, so one AUROC
convention serves all. The sampling baselines take the answers that
:func:`esi_guard.backends.sampling.sample` draws (each one's text and its tokens' logprobs);
semantic scores also take a similarity function over texts (the benchmark uses the packaged
all-MiniLM-L6-v2 embeddings).

Configured as in the ESI paper's appendix ("Baseline Implementation Details"):

* :func:`neg_log_likelihood` / :func:`mean_token_entropy`: free by-products of the greedy
  answer;
* :func:`ln_pe`: length-normalised predictive entropy, 10 samples at temperature 1.0;
* :func:`semantic_entropy`: 10 samples at T=1.0 clustered by bidirectional equivalence,
  cluster probabilities from the samples' length-normalised likelihoods (Farquhar et al.
  2024). The paper decides equivalence with DeBERTa-MNLI entailment both ways; offline we
  use embedding cosine similarity >= a threshold (symmetric, hence bidirectional);
* :func:`lexical_similarity`: 1 - mean pairwise ROUGE-L F among samples;
* :func:`p_true`: 1 - P(True) of the model judging its own greedy answer;
* :func:`sentence_sar`: SAR's sentence-relevance-weighted entropy (Duan et al. 2024) with
  embedding similarity as relevance; :func:`sar`: SAR in full, tokens weighted by their
  relevance first, with a cross-encoder or NLI model's scores (:mod:`benchmarks.nli`) or
  the embedding fallback.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from esi_guard.backends.sampling import Sample
from esi_guard.exceptions import ConfigurationError, ScoringError

__all__ = [
    "PTRUE_PROMPT",
    "Sample",
    "cluster_by_equivalence",
    "lexical_similarity",
    "ln_pe",
    "mean_token_entropy",
    "neg_log_likelihood",
    "p_true",
    "sar",
    "semantic_entropy",
    "sentence_sar",
]

Similarity = Callable[[Sequence[str]], np.ndarray]
"""Texts -> their pairwise similarity matrix (n x n, 1 on the diagonal)."""


def _check(samples: Sequence[Sample], what: str) -> None:
    if not samples:
        msg = f"{what} needs at least one sample"
        raise ScoringError(msg)
    for sample in samples:
        if any(not math.isfinite(lp) for lp in sample.token_logprobs):
            msg = f"{what}: non-finite token log-probability in {sample.text!r}"
            raise ScoringError(msg)


def neg_log_likelihood(token_logprobs: Sequence[float]) -> float:
    """-log P(answer): the greedy answer's improbability (max-probability baseline)."""
    if not token_logprobs:
        msg = "neg_log_likelihood needs at least one answer token"
        raise ScoringError(msg)
    return -float(sum(token_logprobs))


def mean_token_entropy(topk_values: np.ndarray) -> float:
    """Mean entropy of the distributions at the answer's positions, shape (positions, k).

    The values are renormalised over what is given: top-k logits or log-probabilities
    alike (softmax is shift-invariant); ``-inf`` entries (padding) carry no mass.
    """
    values = np.asarray(topk_values, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] == 0:
        msg = f"mean_token_entropy needs a (positions, k) array, got shape {values.shape}"
        raise ScoringError(msg)
    shifted = values - values.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(probs > 0, -probs * np.log(probs), 0.0)
    return float(terms.sum(axis=1).mean())


def ln_pe(samples: Sequence[Sample]) -> float:
    """Length-normalised predictive entropy: mean of -log P(s)/len(s) over samples."""
    _check(samples, "ln_pe")
    return -float(np.mean([s.mean_logprob for s in samples]))


def cluster_by_equivalence(similarity: np.ndarray, threshold: float) -> list[int]:
    """Cluster ids by greedy bidirectional matching (Kuhn et al. 2023).

    A sample joins the first cluster whose first member it matches both ways
    (similarity >= threshold), else starts a new one.
    """
    n = similarity.shape[0]
    labels = [-1] * n
    heads: list[int] = []
    for i in range(n):
        for cluster, head in enumerate(heads):
            if similarity[i, head] >= threshold and similarity[head, i] >= threshold:
                labels[i] = cluster
                break
        else:
            labels[i] = len(heads)
            heads.append(i)
    return labels


def semantic_entropy(samples: Sequence[Sample], similarity: Similarity, threshold: float) -> float:
    """Entropy over meaning clusters, each weighted by its samples' normalised likelihood."""
    _check(samples, "semantic_entropy")
    labels = cluster_by_equivalence(similarity([s.text for s in samples]), threshold)
    log_weights = np.array([s.mean_logprob for s in samples])
    log_weights -= np.logaddexp.reduce(log_weights)  # normalise over the samples
    clusters = np.array(
        [np.logaddexp.reduce(log_weights[np.array(labels) == c]) for c in sorted(set(labels))]
    )
    return float(-(np.exp(clusters) * clusters).sum())


def lexical_similarity(samples: Sequence[Sample]) -> float:
    """1 - mean pairwise ROUGE-L F-measure among the samples' texts (``rouge-score``)."""
    _check(samples, "lexical_similarity")
    if len(samples) < 2:
        msg = "lexical_similarity needs at least two samples"
        raise ScoringError(msg)
    try:
        from rouge_score import rouge_scorer
    except ImportError as exc:
        msg = "lexical_similarity needs rouge-score: pip install 'esi-guard[bench]'"
        raise ConfigurationError(msg) from exc

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    texts = [s.text for s in samples]
    pairs = [
        scorer.score(texts[i], texts[j])["rougeL"].fmeasure
        for i in range(len(texts))
        for j in range(i + 1, len(texts))
    ]
    return 1.0 - float(np.mean(pairs))


PTRUE_PROMPT = (
    "Question: {question}\nProposed Answer: {answer}\n"
    "Is the proposed answer:\n (A) True\n (B) False\nThe proposed answer is:"
)
"""Kadavath et al. (2022)'s P(True) prompt; the model's next token is read for A vs B."""


def p_true(log_true: float, log_false: float) -> float:
    """1 - P(True), from the next-token log-probabilities (or logits) of "A" and "B"."""
    if not (math.isfinite(log_true) and math.isfinite(log_false)):
        msg = "p_true needs finite values for both options"
        raise ScoringError(msg)
    return 1.0 - 1.0 / (1.0 + math.exp(log_false - log_true))


def sentence_sar(
    samples: Sequence[Sample], similarity: Similarity, temperature: float = 0.001
) -> float:
    """SAR's sentence-relevance-weighted entropy (Duan et al. 2024).

    The mean over samples of ``-log(p_i + sum_{j != i} rel(i, j) p_j / t)``, with ``p``
    the length-normalised likelihoods and ``rel`` the similarity clipped to [0, 1].
    """
    _check(samples, "sentence_sar")
    probs = np.exp(np.array([s.mean_logprob for s in samples]))
    return _sentence_shifted(probs, [s.text for s in samples], similarity, temperature)


def _sentence_shifted(
    probs: np.ndarray, texts: list[str], relevance: Similarity, temperature: float
) -> float:
    """SAR's sentence step: mean of ``-log(p_i + sum_{j != i} rel(i, j) p_j / t)``."""
    # Relevance is a score in [0, 1] (SAR's cross-encoder); cosine similarity can be < 0.
    matrix = np.clip(np.asarray(relevance(texts), dtype=np.float64), 0, 1)
    np.fill_diagonal(matrix, 0.0)
    shifted = probs + (matrix @ probs) / temperature
    return float(-np.log(shifted).mean())


PairScore = Callable[[Sequence[str], Sequence[str]], np.ndarray]
"""Scores of text pairs, ``(firsts, seconds) -> (n,)`` in [0, 1]: how much the second keeps
of the first's meaning (an :class:`~benchmarks.nli.NLIModel`'s ``pair_scores``)."""


def sar(
    samples: Sequence[Sample],
    relevance: Similarity,
    temperature: float = 0.001,
    *,
    pairs: PairScore | None = None,
) -> float:
    """SAR (Duan et al. 2024): relevance-weighted tokens, then relevance-shifted sentences.

    Each sample's tokens are weighted by their relevance, ``1 - sim(answer, answer without
    the token)`` (normalised to sum 1), so its probability is
    ``exp(sum_t weight_t * log p_t)`` instead of the plain length-normalised one; the
    sentence step of :func:`sentence_sar` then runs on those probabilities with
    ``relevance``. ``sim`` is ``pairs`` when given (a cross-encoder or NLI model, as the
    paper), else the first row of ``relevance`` over the answer and its token-dropped
    copies (embeddings).

    Raises:
        ScoringError: A sample without its tokens' texts (an API backend gives none).
    """
    _check(samples, "sar")
    log_probs = []
    for sample in samples:
        if len(sample.tokens) != len(sample.token_logprobs):
            msg = "token-level SAR needs each sample's token texts (Sample.tokens)"
            raise ScoringError(msg)
        dropped = ["".join(sample.tokens[:t] + sample.tokens[t + 1 :]).strip()
                   for t in range(len(sample.tokens))]  # fmt: skip
        if pairs is not None:
            kept = np.asarray(pairs([sample.text] * len(dropped), dropped), dtype=np.float64)
        else:
            kept = np.asarray(relevance([sample.text, *dropped]), dtype=np.float64)[0, 1:]
        weights = 1.0 - np.clip(kept, 0.0, 1.0)
        logps = np.array(sample.token_logprobs)
        total = weights.sum()
        log_probs.append(float(logps @ weights / total) if total > 0 else float(logps.mean()))
    probs = np.exp(np.array(log_probs))
    return _sentence_shifted(probs, [s.text for s in samples], relevance, temperature)
