"""The benchmarks' per-question caches: a killed or split run resumes without redoing work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cache import Cache
from benchmarks.common import Answering
from benchmarks.results import closed_book
from esi_guard.calibration.labels import Semantic

HEADER = {"data": "x.jsonl", "model": "m"}


def test_every_shards_records_count_and_a_line_cut_short_is_scored_again(tmp_path: Path) -> None:
    cache = Cache(tmp_path, "sciq-closed", HEADER)
    cache.add((0, 2), [{"index": 0}, {"index": 2}])
    cache.add((1, 2), [{"index": 1}])
    with cache.path((1, 2)).open("a") as out:
        out.write('{"index": 3, "sco')  # a kill in mid-line
    assert sorted(cache.done()) == [0, 1, 2]
    cache.add((1, 2), [{"index": 3}])  # the resumed run appends on a fresh line
    assert sorted(cache.done()) == [0, 1, 2, 3]
    # Another data set's cache beside it is not read as this one's.
    Cache(tmp_path, "nq_open-closed", HEADER).add((0, 1), [{"index": 9}])
    assert 9 not in cache.done()


def test_a_cache_of_another_run_is_refused_not_mixed_in(tmp_path: Path) -> None:
    Cache(tmp_path, "nq_open-closed", HEADER).add((0, 1), [{"index": 0}])
    other = Cache(tmp_path, "nq_open-closed", {**HEADER, "model": "other"})
    with pytest.raises(SystemExit, match="another run"):
        other.done()
    with pytest.raises(SystemExit, match="another run"):
        other.add((0, 1), [{"index": 1}])
    assert len(cache_lines(tmp_path / "nq_open-closed-0of1.jsonl")) == 2  # nothing written


def cache_lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


class _Sampling:
    """Enough of a backend for ``run_closed`` when the scoring itself is stubbed."""

    model_id = "stub"


class _Killed(Exception):
    pass


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "set" / "test.jsonl"
    path.parent.mkdir()
    rows = [{"question": f"Question {i}?", "answer": f"answer {i}"} for i in range(7)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


topped: list[int] = []  # the last _run's questions given only their sampling part
sampled: list[list[int]] = []  # the last _run's report: the questions with sampling scores


def _run(data: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, *, shard: tuple[int, int],
         kill_after: int | None = None, limit: int = 7, parts: closed_book.Parts | None = None,
         dtype: str | None = None) -> tuple[list[int], Any]:  # fmt: skip
    scored: list[int] = []
    reports: list[Any] = []
    topped.clear()
    sampled.clear()

    def score_batch(backend: Any, chunk: list[Any], **kwargs: Any) -> list[dict[str, Any]]:
        if kill_after is not None and len(scored) >= kill_after:
            raise _Killed
        scored.extend(i for i, _ in chunk)
        return [{"index": i, "question": e.question, "answer": "a", "scores": {"m": 0.5},
                 "variants": {}, "seconds": {"generate": 1.0},
                 "parts": kwargs["parts"].needs(i)} for i, e in chunk]  # fmt: skip

    def top_up(backend: Any, chunk: list[Any], **kwargs: Any) -> list[dict[str, Any]]:
        topped.extend(r["index"] for r, _ in chunk)
        return [{**r, "scores": {**r["scores"], "sampled": 1.0},
                 "parts": {**r["parts"], "sampling": True}} for r, _ in chunk]  # fmt: skip

    def report(examples: Any, rows: Any, *args: Any, **kwargs: Any) -> Any:
        reports.append([r["index"] for r in rows])
        sampled.append([r["index"] for r in rows if "sampled" in r["scores"]])
        return [{"dataset": "set"}]

    monkeypatch.setattr(closed_book, "SAMPLERS", (_Sampling,))
    monkeypatch.setattr(closed_book, "score_batch", score_batch)
    monkeypatch.setattr(closed_book, "top_up", top_up)
    monkeypatch.setattr(closed_book, "report", report)
    try:
        out = closed_book.run_closed(
            _Sampling(), data, limit=limit, answering=Answering(4), batch=2, semantic=Semantic(),  # type: ignore[arg-type]
            cache_dir=cache, shard=shard, parts=parts, dtype=dtype,
        )  # fmt: skip
    except _Killed:
        out = None
    return scored, (out, reports)


def test_a_killed_run_resumes_where_it_stopped(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first, (out, _) = _run(data, cache, monkeypatch, shard=(0, 1), kill_after=4)
    assert out is None and len(first) == 4
    second, (out, reports) = _run(data, cache, monkeypatch, shard=(0, 1))
    assert sorted(first + second) == list(range(7))  # nothing scored twice, nothing left
    assert out == [{"dataset": "set"}] and reports == [list(range(7))]


def test_shards_split_the_questions_and_the_last_one_reports(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    even, (out, reports) = _run(data, cache, monkeypatch, shard=(0, 2))
    assert even == [0, 2, 4, 6] and out == [] and reports == []  # odd ones still missing
    odd, (out, reports) = _run(data, cache, monkeypatch, shard=(1, 2))
    assert odd == [1, 3, 5] and reports == [list(range(7))]


def test_a_run_in_another_dtype_is_refused_by_the_cache_of_the_default_one(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    _run(data, cache, monkeypatch, shard=(0, 1))
    with pytest.raises(SystemExit, match="another run"):
        _run(data, cache, monkeypatch, shard=(0, 1), dtype="bfloat16")
    scored, _ = _run(data, tmp_path / "bf16", monkeypatch, shard=(0, 1), dtype="bfloat16")
    assert scored == list(range(7))


def test_a_larger_limit_adds_questions_to_the_same_cache(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    small, _ = _run(data, cache, monkeypatch, shard=(0, 1), limit=3)
    more, (_, reports) = _run(data, cache, monkeypatch, shard=(0, 1), limit=7)
    assert len(small) == 3 and len(more) == 4 and reports == [list(range(7))]


def test_a_larger_sampling_limit_tops_up_the_cached_questions_without_rescoring(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    few = closed_book.Parts(sampling=3, ablation=5)
    assert few.needs(2) == {"sampling": True, "ablation": True, "fidelity": True}
    assert few.needs(3) == {"sampling": False, "ablation": True, "fidelity": True}
    assert closed_book.Parts(fidelity=1).needs(1)["fidelity"] is False
    # A record cached before a part existed counts as having it.
    assert few.covered({"index": 3, "parts": {"sampling": False, "ablation": True}})
    first, _ = _run(data, cache, monkeypatch, shard=(0, 2), parts=few)
    first += _run(data, cache, monkeypatch, shard=(1, 2), parts=few)[0]
    again, _ = _run(data, cache, monkeypatch, shard=(0, 1), parts=few)
    assert sorted(first) == list(range(7)) and again == []  # covered: nothing to redo
    # 3 and 4 lack only the sampling part: topped up. 5 lacks the timed L=2/3/5 passes,
    # which need the greedy answer's distributions: scored anew. Both replace the records
    # shards 0/2 and 1/2 wrote, though shard 0/1 writes them.
    more, (_, reports) = _run(data, cache, monkeypatch, shard=(0, 1),
                              parts=closed_book.Parts(sampling=5, ablation=6))  # fmt: skip
    assert more == [5] and topped == [3, 4] and reports == [list(range(7))]
    assert sampled == [[3, 4]]  # the topped-up records are the ones reported
    again, _ = _run(data, cache, monkeypatch, shard=(0, 1),
                    parts=closed_book.Parts(sampling=5, ablation=6))  # fmt: skip
    assert again == [] and topped == []
