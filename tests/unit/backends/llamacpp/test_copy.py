"""The float copy forcing runs on (``_copy``): its cache folder and when ``"auto"`` makes one."""

from __future__ import annotations

from typing import Any

import pytest


def test_the_cache_folder_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from esi_guard.backends.llamacpp._copy import cache_dir

    monkeypatch.delenv("ESI_GUARD_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "esi_guard"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "esi_guard"
    monkeypatch.setenv("ESI_GUARD_CACHE", str(tmp_path / "own"))
    assert cache_dir() == tmp_path / "own"


def test_auto_forcing_precision_copies_only_a_small_quantized_model_on_the_cpu() -> None:
    """``"auto"``: a float16 copy for quantized weights on the CPU within 2 GiB, else none."""
    from types import SimpleNamespace

    from esi_guard.backends.llamacpp._copy import resolve_precision

    def llama(file_type: int, gpu_layers: int = 0) -> Any:
        return SimpleNamespace(
            metadata={"general.file_type": str(file_type)},
            model_params=SimpleNamespace(n_gpu_layers=gpu_layers),
            _model=SimpleNamespace(model=None),
        )

    def sized(params: int) -> Any:
        return SimpleNamespace(llama_model_n_params=lambda model: params)

    small, large = sized(135_000_000), sized(3_000_000_000)
    assert resolve_precision("auto", llama(3), small) == "f16"  # Q4_1
    assert resolve_precision("auto", llama(15), small) == "f16"  # Q4_K_M
    for float_type in (0, 1, 32):  # float32, float16, bfloat16: forced as they are
        assert resolve_precision("auto", llama(float_type), small) == "model"
    assert resolve_precision("auto", llama(3, gpu_layers=-1), small) == "model"  # on a GPU
    assert resolve_precision("auto", llama(3), large) == "model"  # a copy over 2 GiB
    assert resolve_precision("f32", llama(0), small) == "f32"  # asked: kept
