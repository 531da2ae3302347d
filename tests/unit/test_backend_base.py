"""The backend interface's shared pieces: stop sequences cut an answer at a token boundary."""

from __future__ import annotations

import pytest

from esi_guard.backends import Sampler
from esi_guard.backends.base import stopped_length

PIECES = {1: "Mich", 2: "el", 3: "angelo", 4: " y", 5: "ou", 6: " know"}


def decode(ids: object) -> str:
    return "".join(PIECES[i] for i in ids)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stop", "kept"),
    [
        ([], None),  # nothing to stop at
        (["never"], None),
        (["angelo"], 2),  # a stop that starts on a token boundary
        (["you"], 3),  # " y" holds the stop's first letter and goes with it
        (["ou", "el"], 1),  # the earliest stop wins
        ([""], None),  # an empty stop sequence is no stop sequence
    ],
)
def test_stopped_length(stop: list[str], kept: int | None) -> None:
    assert stopped_length([1, 2, 3, 4, 5, 6], decode, stop) == kept


def test_sampling_is_a_protocol_the_fake_does_not_claim() -> None:
    from esi_guard import FakeBackend, HFBackend

    assert not isinstance(FakeBackend(), Sampler)
    assert issubclass(HFBackend, Sampler)
