"""What llama.cpp may load on this CPU: AMX repacking turned off, builds for another CPU refused.

The logic is tested on llama.cpp system-info strings and CPU flags the tests write, and
the loader on a stand-in ``llama_cpp`` module that records the model parameters a
``Llama`` was built with, so it runs on every CPU (AMX or not) without a model.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest

from esi_guard import ConfigurationError, ModelLoadError
from esi_guard.backends.llamacpp import _cpu, _loading
from esi_guard.backends.llamacpp._cpu import (
    amx_kernels,
    build_key,
    cmake_args,
    cpu_flags,
    crash_line,
    missing_features,
    system_features,
)

AMX_INFO = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
    "BMI2 = 1 | AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | "
    "AMX_INT8 = 1 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | "
)
AVX2_INFO = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
AVX2_CPU = frozenset(["pni", "ssse3", "sse4_2", "avx", "f16c", "fma", "avx2", "bmi2"])
SPR_CPU = AVX2_CPU | frozenset(
    [
        "avx_vnni",
        "avx512f",
        "avx512cd",
        "avx512vl",
        "avx512dq",
        "avx512bw",
        "avx512vbmi",
        "avx512_vnni",
        "avx512_bf16",
        "amx_int8",
        "amx_tile",
        "amx_bf16",
    ]
)


def test_system_info_and_cpu_flags_are_read() -> None:
    features = system_features(AMX_INFO.encode())
    assert features["AVX512"] == "1" and features["REPACK"] == "1"
    assert amx_kernels(features) and not amx_kernels(system_features(AVX2_INFO))
    text = "processor : 0\nmodel name : Some Xeon\nflags : fpu avx2 amx_int8\n"
    assert cpu_flags(text) == frozenset({"fpu", "avx2", "amx_int8"})
    assert _cpu.cpu_name(text) == "Some Xeon"
    assert cpu_flags("no flags here") is None


def test_a_build_for_instructions_the_cpu_lacks_is_named() -> None:
    amx = system_features(AMX_INFO)
    assert missing_features(amx, SPR_CPU) == []
    assert missing_features(amx, AVX2_CPU) == [
        "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX_INT8",
    ]  # fmt: skip
    assert missing_features(system_features(AVX2_INFO), AVX2_CPU) == []
    assert missing_features(amx, None) == []  # flags unknown: nothing claimed


def test_the_projects_build_names_the_cpus_instruction_sets_and_never_amx(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_cpu.platform, "machine", lambda: "x86_64")
    spr = cmake_args(SPR_CPU)
    assert "-DGGML_NATIVE=OFF" in spr and "-DGGML_AVX512=ON" in spr
    assert "AMX" not in spr
    avx2 = cmake_args(AVX2_CPU)
    assert "-DGGML_AVX2=ON" in avx2 and "-DGGML_AVX512=OFF" in avx2
    assert build_key(AVX2_CPU) == "x86_64-sse42-avx-f16c-fma-avx2-bmi2"
    assert build_key(SPR_CPU) != build_key(AVX2_CPU)
    assert "amx" not in build_key(SPR_CPU)
    monkeypatch.setattr(_cpu.platform, "machine", lambda: "aarch64")
    assert cmake_args(frozenset({"neon"})) == ""  # llama.cpp's own native build
    assert build_key(frozenset({"neon"})) == "native-aarch64"


def test_the_script_prints_the_build_for_the_makefile(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cpu.main(["key"]) == 0
    assert capsys.readouterr().out.strip() == build_key()
    assert _cpu.main(["nope"]) == 2


def test_a_crash_is_one_line_naming_the_cpu_feature_and_the_fix() -> None:
    amx = system_features(AMX_INFO)
    line = crash_line("SIGSEGV", amx, SPR_CPU, repacking=True)
    assert "\n" not in line
    assert "AMX_INT8 = 1" in line and "load_llama" in line and "--cmake-args" in line
    wrong_cpu = crash_line("SIGILL", amx, AVX2_CPU, repacking=False)
    assert "AVX512" in wrong_cpu and "lacks" in wrong_cpu and "rebuild" in wrong_cpu
    unknown = crash_line("SIGSEGV", system_features(AVX2_INFO), AVX2_CPU, repacking=True)
    assert "no known CPU cause" in unknown


class _Params:
    def __init__(self) -> None:
        self.use_extra_bufts = True


def fake_llama_cpp(info: str) -> types.ModuleType:
    """A stand-in for llama_cpp: Llama reads llama_model_default_params() as the real one does."""
    module = types.ModuleType("llama_cpp")
    inner = types.ModuleType("llama_cpp.llama_cpp")
    inner.llama_model_default_params = _Params  # type: ignore[attr-defined]
    module.llama_cpp = inner  # type: ignore[attr-defined]
    module.llama_print_system_info = lambda: info.encode()  # type: ignore[attr-defined]

    class Llama:
        def __init__(self, model_path: str, **kwargs: Any) -> None:
            self.model_path = model_path
            self.kwargs = kwargs
            self.model_params = inner.llama_model_default_params()  # type: ignore[attr-defined]

        def close(self) -> None:
            pass

    module.Llama = Llama  # type: ignore[attr-defined]
    return module


@pytest.fixture
def llama_cpp_on(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Install a stand-in llama_cpp with the given system info, on a CPU with AMX."""

    def install(info: str, flags: frozenset[str] = SPR_CPU) -> types.ModuleType:
        module = fake_llama_cpp(info)
        monkeypatch.setitem(sys.modules, "llama_cpp", module)
        monkeypatch.setattr(_loading, "cpu_flags", lambda: flags)
        _loading.llama_features.cache_clear()
        return module

    yield install
    _loading.llama_features.cache_clear()


def test_the_loader_turns_repacking_off_where_llama_cpp_reports_amx(llama_cpp_on: Any) -> None:
    module = llama_cpp_on(AMX_INFO)
    llama = _loading.load_llama("model.gguf", n_ctx=64)
    assert llama.model_params.use_extra_bufts is False
    assert llama.kwargs == {"n_ctx": 64} and llama.model_path == "model.gguf"
    # the swap is undone: a Llama loaded by hand afterwards repacks as llama.cpp's default does
    assert module.llama_cpp.llama_model_default_params().use_extra_bufts is True
    with pytest.raises(ConfigurationError, match=r"AMX.*load_llama"):
        _loading.check_llama(module.Llama(model_path="model.gguf"))
    _loading.check_llama(llama)  # the loader's own passes


def test_without_amx_kernels_repacking_stays_on_and_any_llama_is_taken(llama_cpp_on: Any) -> None:
    module = llama_cpp_on(AVX2_INFO, AVX2_CPU)
    assert _loading.load_llama("model.gguf").model_params.use_extra_bufts is True
    _loading.check_llama(module.Llama(model_path="model.gguf"))


def test_a_build_for_another_cpu_is_refused_before_loading(llama_cpp_on: Any) -> None:
    llama_cpp_on(AMX_INFO, AVX2_CPU)
    with pytest.raises(ModelLoadError, match=r"built for AVX_VNNI, AVX512.*lacks"):
        _loading.load_llama("model.gguf")


def test_a_llama_the_swap_did_not_reach_is_refused(
    llama_cpp_on: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = llama_cpp_on(AMX_INFO)

    class Stubborn(module.Llama):  # type: ignore[name-defined,misc]
        def __init__(self, model_path: str, **kwargs: Any) -> None:
            super().__init__(model_path, **kwargs)
            self.model_params = _Params()  # a llama-cpp-python that reads its params elsewhere

    monkeypatch.setattr(module, "Llama", Stubborn)
    with pytest.raises(ModelLoadError, match="without weight repacking"):
        _loading.load_llama("model.gguf")


def test_the_backend_refuses_a_repacked_llama_before_any_decode(
    llama_cpp_on: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from esi_guard.backends.llamacpp import LlamaCppBackend

    module = llama_cpp_on(AMX_INFO)
    with pytest.raises(ConfigurationError, match="load_llama"):
        LlamaCppBackend(module.Llama(model_path="model.gguf"))
