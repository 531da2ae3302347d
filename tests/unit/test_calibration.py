"""Calibration: metrics against hand values and scikit-learn, threshold rules, the risk
guarantee over many random splits, loaders, labels and the threshold file."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from esi_guard import ConfigurationError, ESIGuard, FakeBackend, InputError, SkipOneChar, Typo
from esi_guard.calibration import labels, metrics, thresholds
from esi_guard.calibration.data import Example, dataset_hash, load_examples, load_files
from esi_guard.calibration.file import DatasetInfo, ThresholdFile
from esi_guard.calibration.prompts import run_prompts
from esi_guard.result import ScoringConfig

# Five answers; higher score = less trusted. Sorted by score: w=0,0,1,0,1.
SCORES = [0.1, 0.2, 0.3, 0.4, 0.5]
WRONG = [0, 0, 1, 0, 1]


def test_auroc_matches_scikit_learn_and_a_hand_count() -> None:
    # Pairs (wrong, right) with the wrong one scored higher: (0.3>0.1, 0.3>0.2, 0.5>all) = 5 of 6.
    assert metrics.auroc(SCORES, WRONG) == pytest.approx(5 / 6)
    rng = np.random.default_rng(1)
    s, w = rng.normal(size=200), rng.integers(0, 2, 200)
    assert metrics.auroc(s, w) == pytest.approx(roc_auc_score(w, s))
    tied = rng.integers(0, 4, 200).astype(float)  # many ties: each counts one half
    assert metrics.auroc(tied, w) == pytest.approx(roc_auc_score(w, tied))
    assert metrics.auroc([0.5, 0.5], [0, 1]) == 0.5
    assert math.isnan(metrics.auroc(SCORES, [1] * 5))


def test_risk_coverage_aurc_and_prr_by_hand() -> None:
    coverage, risk = metrics.risk_coverage(SCORES, WRONG)
    np.testing.assert_allclose(coverage, [0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(risk, [0, 0, 1 / 3, 1 / 4, 2 / 5])
    assert metrics.aurc(SCORES, WRONG) == pytest.approx((0 + 0 + 1 / 3 + 1 / 4 + 2 / 5) / 5)
    oracle = (0 + 0 + 0 + 1 / 4 + 2 / 5) / 5
    random = 2 / 5
    expected = (random - metrics.aurc(SCORES, WRONG)) / (random - oracle)
    assert metrics.prr(SCORES, WRONG) == pytest.approx(expected)
    assert metrics.prr(WRONG, WRONG) == pytest.approx(1.0)  # the oracle itself


def test_selective_accuracy_keeps_the_lowest_scores() -> None:
    assert metrics.selective_accuracy(SCORES, WRONG, 0.4) == 1.0  # 2 kept: both right
    assert metrics.selective_accuracy(SCORES, WRONG, 0.8) == 0.75  # 4 kept, 1 wrong
    assert metrics.selective_accuracy(SCORES, WRONG, 1.0) == 0.6
    with pytest.raises(ValueError, match="coverage"):
        metrics.selective_accuracy(SCORES, WRONG, 0.0)


def test_bootstrap_interval_brackets_the_value_and_summarise_names_every_metric() -> None:
    rng = np.random.default_rng(0)
    w = rng.integers(0, 2, 300)
    s = w + rng.normal(scale=1.0, size=300)
    estimate = metrics.bootstrap(metrics.auroc, s, w, n_resamples=300)
    assert estimate.low < estimate.value < estimate.high
    assert 0.6 < estimate.value < 0.9
    summary = metrics.summarise(s, w, n_resamples=50)
    assert set(summary) == {"auroc", "aurc", "prr", "selective_accuracy@90%",
                            "selective_accuracy@80%", "selective_accuracy@70%"}  # fmt: skip


def test_grouped_bootstrap_measures_each_fitted_model_on_its_own_answers() -> None:
    # Two cross-fitted halves: each ranks its own answers perfectly, but the second
    # model's outputs sit lower, so pooling them ranks half of its wrong answers below
    # the first model's right ones.
    w = np.array([0, 0, 1, 1] * 10)
    first = np.array([0.6, 0.7, 0.8, 0.9] * 5)
    second = np.array([0.1, 0.2, 0.3, 0.4] * 5)
    scores = np.concatenate([first, second])
    groups = np.repeat([0, 1], 20)
    assert metrics.auroc(scores, w) < 0.8
    grouped = metrics.bootstrap(metrics.auroc, scores, w, n_resamples=200, groups=groups)
    assert grouped.value == grouped.low == grouped.high == 1.0
    # Paired: resamples keep each group's examples together for both scores.
    flat = np.tile([0.1, 0.5, 0.3, 0.4], 10)  # per group: AUROC 0.5
    diff = metrics.paired_difference(metrics.auroc, scores, flat, w, n_resamples=200,
                                     groups=groups)  # fmt: skip
    assert diff.value == pytest.approx(0.5)
    assert diff.low > 0
    # Without groups the resampling is what it always was (the same draws, seed 0).
    plain = metrics.bootstrap(metrics.auroc, scores, w, n_resamples=200)
    same = metrics.bootstrap(metrics.auroc, scores, w, n_resamples=200, groups=np.zeros(40))
    assert (plain.value, plain.low, plain.high) == (same.value, same.low, same.high)
    with pytest.raises(ValueError, match="one label per example"):
        metrics.bootstrap(metrics.auroc, scores, w, groups=[0, 1])


def test_threshold_rules() -> None:
    chosen = thresholds.by_coverage(SCORES, WRONG, 0.6)
    assert (chosen.threshold, chosen.coverage) == (0.3, 0.6)
    assert chosen.selective_risk == pytest.approx(1 / 3)
    # Youden: flag > 0.2 catches both wrong (TPR 1) and one right (FPR 1/3): J = 2/3, best.
    assert thresholds.by_youden(SCORES, WRONG).threshold == 0.2
    # F1 of flagging wrong answers: > 0.2 gives P=2/3, R=1, F1=0.8; > 0.4 gives P=R=1/2.
    assert thresholds.by_f1(SCORES, WRONG).threshold == 0.2


@pytest.mark.parametrize("alpha", [0.05, 0.1, 0.2, 0.3, 0.5])
@pytest.mark.parametrize("m", [2, 20, 100, 1000, 10_000])
def test_min_accepted_is_the_fewest_error_free_answers_the_bound_accepts(
    alpha: float, m: int
) -> None:
    delta = 0.1
    tests = thresholds.risk_tests(m)
    needed = thresholds.min_accepted(alpha, delta, tests)
    assert thresholds.risk_bound(0, needed, delta / tests) <= alpha
    assert needed == 1 or thresholds.risk_bound(0, needed - 1, delta / tests) > alpha


@pytest.mark.parametrize("alpha", [0.1, 0.2, 0.3])
def test_min_examples_is_the_smallest_set_the_risk_rule_can_accept_on(alpha: float) -> None:
    assert [thresholds.risk_tests(m) for m in (1, 2, 20, 100, 1000)] == [1, 1, 5, 7, 10]
    m = thresholds.min_examples(alpha, 0.1)
    # The search tests the median first: half the set must hold min_accepted answers.
    assert m // 2 + 1 >= thresholds.min_accepted(alpha, 0.1, thresholds.risk_tests(m))
    assert thresholds.by_risk(list(range(m)), [0] * m, alpha=alpha, delta=0.1) is not None
    assert thresholds.by_risk(list(range(m - 1)), [0] * (m - 1), alpha=alpha, delta=0.1) is None
    with pytest.raises(ValueError, match="alpha and delta"):
        thresholds.min_accepted(0.0, 0.1)


def test_clopper_pearson_bound_by_hand() -> None:
    # 0 errors in n: the bound solves (1-b)^n = delta.
    assert thresholds.risk_bound(0, 50, 0.1) == pytest.approx(1 - 0.1 ** (1 / 50))
    assert thresholds.risk_bound(5, 5, 0.1) == 1.0
    assert thresholds.risk_bound(10, 100, 0.05) > 0.1


def test_risk_rule_says_no_when_the_target_cannot_be_met() -> None:
    assert thresholds.by_risk(SCORES, WRONG, alpha=0.05, delta=0.1) is None
    rng = np.random.default_rng(3)
    w = rng.integers(0, 2, 2000)
    s = w * 2 + rng.normal(size=2000)
    choice = thresholds.by_risk(s, w, alpha=0.2, delta=0.1)
    assert choice is not None and choice.guarantee is not None
    assert choice.guarantee["risk_bound"] <= 0.2
    assert choice.selective_risk <= choice.guarantee["risk_bound"]
    assert 0.3 < choice.coverage < 0.7


def _population(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores and labels where wrong answers tend to score higher (AUROC about 0.75)."""
    wrong = rng.random(n) < 0.4
    scores = rng.normal(loc=np.where(wrong, 1.0, 0.0), scale=1.0)
    return scores, wrong.astype(int)


def test_the_risk_guarantee_holds_over_many_random_calibration_sets() -> None:
    # With probability >= 1 - delta over the calibration set, the true selective risk of the
    # chosen threshold is <= alpha. A large fresh test set stands in for the true risk.
    alpha, delta, n_cal, n_splits = 0.25, 0.1, 500, 600
    rng = np.random.default_rng(2024)
    test_scores, test_wrong = _population(rng, 200_000)
    order = np.argsort(test_scores)
    cum_errors = np.cumsum(test_wrong[order])
    sorted_scores = test_scores[order]
    violations = chosen = 0
    for _ in range(n_splits):
        scores, wrong = _population(rng, n_cal)
        choice = thresholds.by_risk(scores, wrong, alpha, delta)
        if choice is None:
            continue
        chosen += 1
        kept = int(np.searchsorted(sorted_scores, choice.threshold, side="right"))
        risk = cum_errors[kept - 1] / kept if kept else 0.0
        violations += risk > alpha
    assert chosen >= n_splits * 0.9  # the target is reachable for this population
    rate = violations / chosen
    slack = 3 * math.sqrt(delta * (1 - delta) / chosen)
    print(f"risk guarantee: {violations}/{chosen} splits above alpha ({rate:.3f}; delta {delta})")
    assert rate <= delta + slack


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_loaders_read_every_shared_format(tmp_path: Path) -> None:
    sciq = write_jsonl(tmp_path / "sciq.jsonl", [{"query": "Q1?", "truthful answer": ["a"]}])
    nq = write_jsonl(tmp_path / "nq.jsonl", [{"question": "q2", "answer": ["b", "c"]}])
    trivia = write_jsonl(
        tmp_path / "t.jsonl",
        [{"context": "Question: Who?\nAnswer:", "answer": "D", "aliases": ["D", "dee"]}],
    )
    csv = tmp_path / "TruthfulQA.csv"
    csv.write_text(
        "\ufeffType,Question,Best Answer,Correct Answers,Incorrect Answers\n"
        'Adversarial,Why?,Because,"Because; No reason",Magic; Fate\n',
        encoding="utf-8",
    )
    custom = write_jsonl(
        tmp_path / "custom.jsonl", [{"prompt": "Q?", "gold": "x", "false": ["y", "z"]}]
    )
    assert load_examples(sciq)[0].answers == ("a",)
    assert load_examples(nq)[0].answers == ("b", "c")
    assert load_examples(trivia)[0].question == "Who?"
    assert load_examples(csv)[0].answers == ("Because", "No reason")
    assert load_examples(csv)[0].incorrect == ("Magic", "Fate")
    assert load_examples(sciq)[0].incorrect == ()
    named = {"question_field": "prompt", "answers_field": "gold"}
    assert load_examples(custom, **named)[0].answers == ("x",)
    assert load_examples(custom, **named, incorrect_field="false")[0].incorrect == ("y", "z")
    with pytest.raises(InputError, match="missing field 'wrong'"):
        load_examples(custom, **named, incorrect_field="wrong")
    with pytest.raises(InputError, match="--question-field"):
        load_examples(custom)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"query": "q", "truthful answer": ["a"]}\n{oops\n', encoding="utf-8")
    with pytest.raises(InputError, match=r"broken\.jsonl:2"):
        load_examples(broken)
    with pytest.raises(InputError, match="not found"):
        load_examples(tmp_path / "missing.jsonl")


def test_the_question_answers_wrong_shape_is_known_without_field_names(tmp_path: Path) -> None:
    rows = [
        {"question": "Who wrote Hamlet?", "answers": ["Shakespeare"], "wrong": ["Marlowe"]},
        {"question": "Capital of Peru?", "answers": ["Lima"], "wrong": []},
    ]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    first, second = load_examples(path)
    assert first.answers == ("Shakespeare",) and first.incorrect == ("Marlowe",)
    assert second.incorrect == ()
    csv = tmp_path / "mine.csv"
    csv.write_text("question,answers,wrong\nHow many legs has a spider?,8; eight,6\n")
    assert load_examples(csv)[0].answers == ("8", "eight")
    assert load_examples(csv)[0].incorrect == ("6",)


def test_csv_answers_split_on_the_separator_given(tmp_path: Path) -> None:
    csv = tmp_path / "qa.csv"
    csv.write_text("q,a,bad\nHow many legs has a spider?,8|eight,6|six\n")
    named = {"question_field": "q", "answers_field": "a", "incorrect_field": "bad"}
    assert load_examples(csv, **named)[0].answers == ("8|eight",)
    split = load_examples(csv, **named, answers_sep="|")[0]
    assert split.answers == ("8", "eight") and split.incorrect == ("6", "six")
    jsonl = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answers": "8|eight"}])
    assert load_examples(jsonl, answers_sep="|")[0].answers == ("8|eight",)  # CSV only
    with pytest.raises(InputError, match="separator"):
        load_examples(csv, **named, answers_sep="")


def test_several_files_concatenate_in_order_each_cut_and_shuffled_apart(tmp_path: Path) -> None:
    first = write_jsonl(tmp_path / "a.jsonl", [{"question": f"a{i}", "answer": ["x"]}
                                              for i in range(10)])  # fmt: skip
    second = write_jsonl(tmp_path / "b.jsonl", [{"query": f"b{i}", "truthful answer": ["y"]}
                                                for i in range(10)])  # fmt: skip
    both = load_files([first, second], limit=3, seed=4)
    assert both == load_examples(first, limit=3, seed=4) + load_examples(second, limit=3, seed=4)
    assert [e.question[0] for e in both] == ["a"] * 3 + ["b"] * 3
    assert dataset_hash(both) != dataset_hash(load_files([second, first], limit=3, seed=4))
    with pytest.raises(InputError, match="no data file"):
        load_files([])


def test_passage_and_closed_book_data_are_not_mixed() -> None:
    mixed = [Example("q", ("a",), context="passage"), Example("r", ("b",))]
    with pytest.raises(InputError, match="mixes"):
        run_prompts(mixed, None, None, None)


def test_loader_shuffles_with_a_seed_and_the_hash_follows_the_examples(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": [str(i)]} for i in range(20)]
    path = write_jsonl(tmp_path / "nq.jsonl", rows)
    first = load_examples(path, seed=1, limit=5)
    assert first == load_examples(path, seed=1, limit=5)
    assert first != load_examples(path, limit=5)
    assert dataset_hash(first) == dataset_hash(load_examples(path, seed=1, limit=5))
    assert dataset_hash(first) != dataset_hash(load_examples(path, seed=2, limit=5))


def test_labels() -> None:
    questions = ["q"] * 4
    predictions = ["The answer is Charles Darwin.", "darwin", "Lamarck", ""]
    gold = [["Darwin"]] * 4
    assert labels.Containment().label(questions, predictions, gold) == [True, True, False, False]
    assert labels.ExactMatch().label(questions, predictions, gold) == [False, True, False, False]
    assert labels.token_f1("the Charles Darwin", "Darwin") == pytest.approx(2 * 0.5 / 1.5)
    assert labels.TokenF1(0.6).label(questions, predictions, gold) == [False, True, False, False]
    assert labels.Containment().label(["q"], ["Parisian"], [["Paris"]]) == [False]  # word-aligned


def test_llm_judge_uses_any_runnable() -> None:
    from langchain_core.runnables import RunnableLambda

    judge = labels.LLMJudge(RunnableLambda(lambda p: "Correct." if "Darwin" in p.split(
        "Answer to grade:")[1] else "incorrect"))  # fmt: skip
    assert judge.label(["Who?", "Who?"], ["Darwin", "Lamarck"], [["Darwin"], ["Darwin"]]) == [
        True, False]  # fmt: skip
    assert judge.name == "llm_judge(RunnableLambda)"
    seen: list[str] = []
    recording = labels.LLMJudge(RunnableLambda(lambda p: seen.append(p) or "incorrect"))
    recording.label(["Who?", "Who?"], ["Lamarck", "Darwin"], [["Darwin"]] * 2, [["Lamarck"], []])
    assert "Known wrong answers: Lamarck" in seen[0]
    assert "Known wrong answers" not in seen[1]


def threshold_file(**changes: Any) -> ThresholdFile:
    values: dict[str, Any] = {
        "threshold": 0.3, "method": "coverage=0.8", "calibration_coverage": 0.8,
        "calibration_selective_risk": 0.2, "model": "fake",
        "scoring": ScoringConfig(intervention=SkipOneChar().describe(), n_variants=10, top_k=100,
                                 distance="hellinger", values="logits", approximate=False, seed=0,
                                 max_new_tokens=64),
        "label_method": "containment",
        "dataset": DatasetInfo(path="d.jsonl", sha256="0" * 64, n=10),
        "metrics": {"auroc": {"value": 0.7, "low": 0.6, "high": 0.8}},
        "created": "2026-11-22T00:00:00+00:00", "esi_guard_version": "0.1.0",
    }  # fmt: skip
    values.update(changes)
    return ThresholdFile(**values)


def test_threshold_file_round_trip_and_guard(tmp_path: Path) -> None:
    path = tmp_path / "threshold.json"
    threshold_file().write(path)
    assert ThresholdFile.read(path) == threshold_file()
    guard = ESIGuard.from_calibration(path, backend=FakeBackend(), action="abstain")
    assert guard.threshold == 0.3 and guard.n_variants == 10 and guard.action == "abstain"
    assert guard.intervention == SkipOneChar()


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"model": "another-model"}, "model"),
        ({"top_k": 20}, "top_k"),
        ({"intervention": Typo()}, "intervention"),
        ({"n_variants": 5}, "n_variants"),
        ({"support": "all"}, "support"),
        ({"intervention": SkipOneChar(distinct=False)}, "intervention"),
    ],
)
def test_a_mismatched_threshold_file_is_refused(
    tmp_path: Path, kwargs: dict[str, Any], problem: str
) -> None:
    path = tmp_path / "threshold.json"
    model = kwargs.pop("model", None)
    threshold_file(**({"model": model} if model else {})).write(path)
    with pytest.raises(ConfigurationError, match=problem):
        ESIGuard.from_calibration(path, backend=FakeBackend(), **kwargs)


def test_a_file_from_before_distinct_variants_rebuilds_the_draws_it_was_calibrated_with(
    tmp_path: Path,
) -> None:
    path = tmp_path / "threshold.json"
    old = {"name": "skip_one_char", "p": 0.3, "min_chars": 3}  # esi-guard 0.1.0's describe()
    scoring = threshold_file().scoring.model_copy(update={"intervention": old})
    threshold_file(scoring=scoring).write(path)
    guard = ESIGuard.from_calibration(path, backend=FakeBackend())
    assert guard.intervention == SkipOneChar(distinct=False) and guard.support == "pair"
    with pytest.raises(ConfigurationError, match="intervention"):
        ESIGuard.from_calibration(path, backend=FakeBackend(), intervention=SkipOneChar())


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "not found"), ("{not json", "not readable JSON"), ('{"a": 1}', "not an esi-guard"),
     ('{"format": "esi-guard/threshold", "threshold": "x"}', "invalid")],
)  # fmt: skip
def test_a_missing_or_corrupt_threshold_file_is_a_clear_error(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "threshold.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigurationError, match=problem):
        ThresholdFile.read(path)


def test_the_docs_example_of_a_users_own_data_loads() -> None:
    path = Path(__file__).resolve().parents[2] / "docs" / "examples" / "my_qa.jsonl"
    examples = load_examples(path)  # the documented shape: no field names needed
    assert examples == load_examples(
        path, question_field="question", answers_field="answers", incorrect_field="wrong"
    )
    # Enough for the risk rule the README shows (all right would need this many).
    needed = thresholds.min_accepted(0.3, 0.1, thresholds.risk_tests(len(examples)))
    assert 60 <= len(examples) <= 80 and len(examples) > 3 * needed
    assert len({e.question for e in examples}) == len(examples)
    assert all(e.answers and e.incorrect for e in examples)
