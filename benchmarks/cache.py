"""Per-question JSONL caches: a long benchmark run resumes, and can be split over processes.

One file per shard, ``<directory>/<name>-<k>of<n>.jsonl``, its first line the run's header;
a cache written by another run (other data, model or settings) is refused, never mixed in.
Each question's record is appended as soon as its batch is done; a line cut short by a kill
is dropped and that question scored again. Every shard's records count as done, so a run
can be re-split (another ``--shard``) between sessions. A question's record written again
(a part added, or scored anew) replaces the earlier one, whichever shard wrote either: each
write of an index carries the next ``"revision"``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["Cache"]


class Cache:
    """The records of one run (``name``) under ``directory``, keyed by ``record["index"]``."""

    def __init__(self, directory: Path, name: str, header: dict[str, Any]) -> None:
        self.directory = directory
        self.name = name
        self.header = header
        self._checked: set[Path] = set()  # files whose header was read once already

    def path(self, shard: tuple[int, int]) -> Path:
        """The file of shard ``k`` of ``n``."""
        k, n = shard
        return self.directory / f"{self.name}-{k}of{n}.jsonl"

    def done(self) -> dict[int, dict[str, Any]]:
        """Every shard's records so far, by index."""
        rows: dict[int, dict[str, Any]] = {}
        for path in sorted(self.directory.glob(f"{self.name}-*of*.jsonl")):
            for index, record in self._read(path).items():
                if index not in rows or _revision(record) >= _revision(rows[index]):
                    rows[index] = record
        return rows

    def add(self, shard: tuple[int, int], records: Iterable[dict[str, Any]]) -> None:
        """Append ``records`` to the shard's file (made, with the header, if new)."""
        path = self.path(shard)
        if path not in self._checked:  # refuses another run's file before writing to it
            self._read(path)
            self._checked.add(path)
        with path.open("rb") as old:
            old.seek(-1, 2)
            cut = old.read(1) != b"\n"  # the last line was cut short by a kill
        earlier = self.done()
        with path.open("a", encoding="utf-8") as out:
            if cut:
                out.write("\n")
            for record in records:
                if record["index"] in earlier:
                    record = {**record, "revision": _revision(earlier[record["index"]]) + 1}
                out.write(json.dumps(record) + "\n")

    def fill(
        self,
        shard: tuple[int, int],
        todo: Sequence[T],
        batch: int,
        score: Callable[[Sequence[T]], Iterable[dict[str, Any]]],
    ) -> None:
        """Score ``todo`` in batches of ``batch``, each batch's records kept as it ends."""
        k, n = shard
        for start in range(0, len(todo), batch):
            self.add(shard, score(todo[start : start + batch]))
            done = min(start + batch, len(todo))
            print(f"  {self.name} shard {k}/{n}: {done}/{len(todo)}", flush=True)

    def _read(self, path: Path) -> dict[int, dict[str, Any]]:
        if not path.exists() or path.stat().st_size == 0:
            self.directory.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(self.header) + "\n", encoding="utf-8")
            return {}
        lines = path.read_text(encoding="utf-8").splitlines()
        if json.loads(lines[0]) != self.header:
            msg = f"{path} was written by another run (data, model or settings differ)"
            raise SystemExit(msg)
        done = {}
        for line in lines[1:]:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # cut short by a kill: scored again
            done[record["index"]] = record
        return done


def _revision(record: dict[str, Any]) -> int:
    return int(record.get("revision", 0))
