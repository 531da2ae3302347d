"""The run's typed cache header, the records written through ``ESIGuard.assess``, and the
threshold file built from the header by ``ThresholdFile.from_run``."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from esi_guard import ESIGuard, FakeBackend
from esi_guard.backends.hidden import FINAL, HiddenSpec
from esi_guard.calibration.data import Example
from esi_guard.calibration.file import DatasetInfo, ThresholdFile
from esi_guard.calibration.metrics import Estimate
from esi_guard.calibration.thresholds import Choice
from esi_guard.cli.run import CACHE_KIND, RunHeader
from esi_guard.cli.run.cache import complete_cache
from esi_guard.cli.run.score import fill_states, score_chunk, score_examples

HIDDEN = HiddenSpec((1, FINAL), ("prompt_last",))


def guard(hidden: HiddenSpec | None = None) -> ESIGuard:
    answers = {"Where is Paris?": "France", "Which is 2+2?": "4", "Who wrote it?": "me"}
    levels = {"Where is Paris?": 0.1, "Which is 2+2?": 0.9}
    return ESIGuard(backend=FakeBackend(answers, sensitivity=levels), threshold=0.0,
                    n_variants=2, top_k=10, max_new_tokens=8, hidden_states=hidden)  # fmt: skip


EXAMPLES = [
    Example("Where is Paris?", ("France",)),
    Example("Which is 2+2?", ("4",)),
    Example("Who wrote it?", ("you",)),
]


def test_the_header_line_reads_back_to_the_same_bytes() -> None:
    header = RunHeader.of(guard(HIDDEN), "ab" * 32, "Be brief.", None, {"model": "fake"})
    line = json.dumps(header.as_json())
    assert list(json.loads(line))[:4] == ["kind", "version", "request", "dataset_sha256"]
    assert json.loads(line)["kind"] == CACHE_KIND
    again = RunHeader.from_json(json.loads(line))
    assert again == header and json.dumps(again.as_json()) == line
    assert again.hidden_states == HIDDEN and again.scoring.system_prompt == "Be brief."


def test_records_hold_the_results_and_a_complete_cache_gives_the_typed_header(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "c.jsonl"
    scorer = guard()
    header = RunHeader.of(scorer, "cd" * 32, None, None, {"n": 1})
    records = score_examples(scorer, EXAMPLES, cache=cache, header=header, batch_size=2)
    direct = scorer.assess([[("human", e.question)] for e in EXAMPLES])
    for record, result in zip(records, direct, strict=True):
        assert not isinstance(result, Exception)
        assert record["prediction"] == result.answer and record["score"] == result.score
        assert record["variant_scores"] == result.variant_scores
        assert record["signals"] == result.signals and "hidden" not in record
    found = complete_cache(cache, {"n": 1}, "cd" * 32, len(EXAMPLES))
    assert found is not None and found[0] == header and found[1] == records


def test_fill_states_adds_the_states_to_a_donor_s_records(tmp_path: Path) -> None:
    plain, keeping = guard(), guard(HIDDEN)
    donor = score_examples(plain, EXAMPLES, cache=tmp_path / "plain.jsonl",
                           header=RunHeader.of(plain, "ef" * 32, None))  # fmt: skip
    cache = tmp_path / "hidden.jsonl"
    header = RunHeader.of(keeping, "ef" * 32, None)
    written = fill_states(keeping, EXAMPLES, dict(enumerate(donor)), cache=cache, header=header)
    lines = [json.loads(line) for line in cache.read_text().splitlines()[1:]]
    assert written == len(EXAMPLES) == len(lines)
    for line, record in zip(lines, donor, strict=True):
        assert line["hidden"]["layers"] == [1, FINAL]
        assert {k: v for k, v in line.items() if k != "hidden"} == record


def test_the_threshold_file_is_built_from_the_run_header() -> None:
    header = RunHeader.of(guard(), "01" * 32, "Be brief.", None)
    choice = Choice(threshold=0.25, method="f1", coverage=0.5, selective_risk=math.nan)
    dataset = DatasetInfo(path="qa.jsonl", sha256="01" * 32, n=3)
    file = ThresholdFile.from_run(
        header, choice, label_method="containment", dataset=dataset,
        metrics={"auroc": Estimate(0.7, math.nan, 0.9)}, version="1.2.3",
    )  # fmt: skip
    assert (file.model, file.engine, file.model_sha256) == ("fake", "fake", None)
    assert file.scoring == header.scoring and file.threshold == 0.25
    assert file.calibration_selective_risk is None
    assert file.metrics == {"auroc": {"value": 0.7, "low": None, "high": 0.9}}
    assert file.esi_guard_version == "1.2.3" and file.created


class _Backwards:
    """A pool of workers (``--workers``) in process: the batches scored, finished last first.

    (Scored in order: the fake backend numbers words as it meets them.)
    """

    def __init__(self, scorer: ESIGuard) -> None:
        self.scorer = scorer
        self.chunks: list[list[int]] = []

    def records(self, chunks: list[list[int]]) -> Iterator[tuple[list[int], list[dict[str, Any]]]]:
        self.chunks = [list(c) for c in chunks]
        done = [(c, score_chunk(self.scorer, EXAMPLES, c, None, None)) for c in chunks]
        yield from reversed(done)


def test_batches_scored_by_workers_give_the_same_records_and_a_resumable_cache(
    tmp_path: Path,
) -> None:
    header = RunHeader.of(guard(), "ef" * 32, None, None, {"n": 2})
    here = score_examples(guard(), EXAMPLES, cache=tmp_path / "one.jsonl", header=header,
                          batch_size=2)  # fmt: skip
    pool = _Backwards(guard())
    spread = score_examples(None, EXAMPLES, cache=tmp_path / "two.jsonl", header=header,
                            batch_size=2, pool=pool)  # fmt: skip
    assert pool.chunks == [[0, 1], [2]]  # the batches one process scores
    assert spread == here  # in the examples' order, whatever order the batches finished in
    lines = (tmp_path / "two.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines[1:]] == [2, 0, 1]
    again = _Backwards(guard())
    assert score_examples(None, EXAMPLES, cache=tmp_path / "two.jsonl", header=header,
                          batch_size=2, pool=again) == here  # fmt: skip
    assert again.chunks == []  # all found in the cache
