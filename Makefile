# Set-up and entry points. `make demo` and `make test` work on a fresh machine:
# each creates or updates .venv and installs what it needs from the package registries.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# PyTorch is pinned here, not in the library: 2.13.0 is the CPU build this machine
# family keeps on disk; a bare `torch` would pull a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-fast fuzz load lint docs install-demo install-test install-litellm-proxy clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip

$(VENV)/.demo-installed: pyproject.toml | $(BIN)/python
	$(PIP) "$(TORCH_SPEC)"
	$(PIP) -e ".[hf,demo,llamacpp]"
	touch $@

$(VENV)/.test-installed: pyproject.toml $(VENV)/.demo-installed
	$(PIP) -e ".[hf,demo,llamacpp,api,cli,agents,serve,litellm,dev,docs]"
	touch $@

# LiteLLM's proxy, for the test that runs ESIGuardrail inside it (tests/server/test_litellm_proxy.py):
# a virtual environment of its own, as the proxy is a process of its own. litellm[proxy] pins
# its dependencies, and the newest (1.110) extra needs a `litellm-proxy` distribution the
# package registry lacks, hence 1.108.
LITELLM_VENV ?= .venv-litellm
LITELLM_SPEC ?= litellm[proxy]==1.108.*

$(LITELLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "$(LITELLM_SPEC)" -e ".[litellm]"
	touch $@

install-demo: $(VENV)/.demo-installed
install-test: $(VENV)/.test-installed
install-litellm-proxy: $(LITELLM_VENV)/.installed

## Run the guard over the embedded default model on a handful of questions.
demo: install-demo
	$(BIN)/python examples/quickstart.py

## The whole test suite: unit tests and integration tests on the embedded model.
test: install-test install-litellm-proxy
	$(BIN)/python -m pytest

## Unit tests only (no model).
test-fast: install-test
	$(BIN)/python -m pytest -m "not integration"

## >= 10,000 adversarial inputs on the fake backend and 300 on the embedded model.
## Ends with `fuzz: inputs=N crashes=N hangs=N unmarked=N`; fails unless the last three are 0.
fuzz: install-test
	$(BIN)/python tests/fuzz/fuzz.py --fake 10000 --model 300

## 1,000 guarded requests through `abatch` against the real llama.cpp server behind a
## fault-injecting proxy, with one server restart. Ends with
## `load: requests=N lost=N duplicated=N retries=N p50_ms=N p99_ms=N`; fails on loss.
load: install-test
	$(BIN)/python tests/server/load.py --requests 1000

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
