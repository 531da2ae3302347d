"""The calibration figure: ROC curve and risk-coverage curve, side by side (matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from esi_guard.calibration.metrics import aurc, auroc, risk_coverage

__all__ = ["plot_calibration"]


def plot_calibration(
    path: str | Path,
    scores: Sequence[float],
    wrong: Sequence[int],
    *,
    threshold: float | None = None,
    title: str = "",
) -> None:
    """Write a PNG of the ROC (wrong = positive) and risk-coverage curves, the threshold marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from sklearn.metrics import roc_curve

    fpr, tpr, _ = roc_curve(list(wrong), list(scores))
    coverage, risk = risk_coverage(scores, wrong)
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4.2))
    left.plot(fpr, tpr, label=f"ESI (AUROC {auroc(scores, wrong):.3f})")
    left.plot([0, 1], [0, 1], linestyle="--", color="grey", label="chance")
    left.set(xlabel="false positive rate (right answers flagged)",
             ylabel="true positive rate (wrong answers flagged)", title="ROC")  # fmt: skip
    right.plot(coverage, risk, label=f"ESI (AURC {aurc(scores, wrong):.3f})")
    right.axhline(sum(wrong) / len(wrong), linestyle="--", color="grey", label="no selection")
    right.set(xlabel="coverage (answers accepted)", ylabel="selective risk (error rate)",
              title="Risk-coverage", xlim=(0, 1), ylim=(0, 1))  # fmt: skip
    if threshold is not None:
        accepted = [w for s, w in zip(scores, wrong, strict=True) if s <= threshold]
        if accepted:
            point = (len(accepted) / len(scores), sum(accepted) / len(accepted))
            right.plot(*point, "o", color="red", label=f"threshold {threshold:.3f}")
            flagged_wrong = sum(w for s, w in zip(scores, wrong, strict=True) if s > threshold)
            flagged_right = sum(1 - w for s, w in zip(scores, wrong, strict=True) if s > threshold)
            left.plot(flagged_right / max(len(wrong) - sum(wrong), 1),
                      flagged_wrong / max(sum(wrong), 1), "o", color="red",
                      label=f"threshold {threshold:.3f}")  # fmt: skip
    left.legend(loc="lower right")
    right.legend(loc="upper left")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
