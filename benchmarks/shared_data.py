"""Where the project's tests, fuzz and load runs and benchmarks find the shared QA sets.

The sets are read in place, never copied into the repository. Looked for, in order:
``$ESI_GUARD_SHARED_DATA``; ``../shared/data`` beside this checkout; and, for a clone of a
local checkout (a scratch clone in /tmp, say), ``../shared/data`` beside its origin.
Benchmarks and tests import it from the checkout's root (`python -m ...`, pytest).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["CHECKOUT", "SharedDataMissing", "candidates", "shared_data"]

CHECKOUT = Path(__file__).resolve().parents[1]
"""The root of this checkout."""


class SharedDataMissing(FileNotFoundError):
    """None of the places looked in holds the shared data; the message lists them."""


def candidates() -> list[Path]:
    """The folders looked in, in order."""
    found = []
    if os.environ.get("ESI_GUARD_SHARED_DATA"):
        found.append(Path(os.environ["ESI_GUARD_SHARED_DATA"]))
    found.append(CHECKOUT.parent / "shared" / "data")
    origin = subprocess.run(
        ["git", "-C", str(CHECKOUT), "config", "--get", "remote.origin.url"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if origin and Path(origin).is_dir():
        found.append(Path(origin).resolve().parent / "shared" / "data")
    return found


def shared_data() -> Path:
    """The first folder that exists; :class:`SharedDataMissing` names every one looked in."""
    looked = candidates()
    for folder in looked:
        if folder.is_dir():
            return folder
    where = ", ".join(str(folder) for folder in looked)
    msg = f"shared data missing: looked in {where}; set ESI_GUARD_SHARED_DATA"
    raise SharedDataMissing(msg)
