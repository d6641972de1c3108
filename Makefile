# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) .venv and install what they need.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is installed from its pin first, so that no resolver ever pulls another
# build (with its several GB of CUDA packages).
TORCH_PIN := torch==2.13.0
STAMP := $(VENV)/.installed

.PHONY: demo test bench docs venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[torch,gymnasium,demo,dev,tensorflow,ray,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/replaybuffer demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/replaybuffer bench

# The documentation site (mkdocs.yml, docs/) into site/; warnings are errors.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis
