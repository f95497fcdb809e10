# make demo: create .venv, install, run the embedded DAPO example end to end (warm start included).
# make test: install, build the docs site (make docs) and run the test suite (slow end-to-end tests included).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: install demo test test-fast docs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# torch first: with torch 2.13.0 already installed, nothing later pulls a CUDA build. Then the
# package with the test, wandb, math, sandbox and ray extras at the exact versions CI uses
# (constraints.txt, inside pyproject.toml's ranges; its torch pin is $(TORCH)'s version).
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet $(TORCH)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,wandb,math,sandbox,ray,docs]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/reasonrl demo

test: install docs
	$(BIN)/python -m pytest -q --timeout=900

# The docs site in site/: the config and CLI reference pages are generated from the code first,
# and --strict fails on a broken link or anchor.
docs: install
	$(BIN)/python docs/gen_ref.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" --timeout=300

clean:
	rm -rf $(VENV) runs .pytest_cache site docs/reference
