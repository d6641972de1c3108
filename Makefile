# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both create (or reuse) .venv. `make demo` installs only what the demo needs (torch,
# gymnasium, tqdm, matplotlib: the demo extra); `make test` installs every extra it tests.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch is installed from its pin first, so that no resolver ever pulls another
# build (with its several GB of CUDA packages).
TORCH_PIN := torch==2.13.0
# The full install (every extra) and the demo's install each have a stamp of their own:
# a venv made by `make demo` still gets the full install from `make test`.
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: demo test bench docs venv venv-demo clean release-check

venv: $(STAMP)

venv-demo: $(DEMO_STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[torch,gymnasium,demo,dev,tensorflow,ray,torchrl,release,fast,sb3,docs]'
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH_PIN)
	$(PIP) install -q -e '.[demo]'
	touch $(DEMO_STAMP)

# A venv with the full install already runs the demo: no second install.
demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(VENV)/bin/replaybuffer demo

test: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy
	$(PY) -m pytest -q

# The release as a user gets it: sdist and wheel built and checked, the wheel installed
# without extras into a fresh venv (away from this checkout) and .ci/release_smoke.py run
# there: the library alone, a buffer built, saved, loaded and inspected on numpy and optree.
# The demos and the benchmark harness (src/replaybuffer_demos, src/replaybuffer_bench) are
# not in the wheel: `make demo` and `make bench` run them from this checkout.
RELEASE_VENV := build/release-venv
release-check: $(STAMP)
	rm -rf dist $(RELEASE_VENV) build/release-smoke
	$(PY) -m build --outdir dist .
	$(VENV)/bin/twine check --strict dist/*
	$(PYTHON) -m venv $(RELEASE_VENV)
	$(RELEASE_VENV)/bin/pip install -q --upgrade pip
	$(RELEASE_VENV)/bin/pip install -q "$$(ls dist/*.whl)"
	cd build && release-venv/bin/python -I ../.ci/release_smoke.py

bench: $(STAMP)
	$(VENV)/bin/replaybuffer bench

# The documentation site (mkdocs.yml, docs/) into site/; warnings are errors.
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache .hypothesis .mypy_cache
