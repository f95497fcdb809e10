# make demo: create .venv, install, run the embedded DAPO example end to end (warm start included).
# make test: install, build the docs site (make docs) and run the test suite (slow end-to-end tests included).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
JOBS ?= 2

.PHONY: install demo test test-fast docs clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# uv fetches, unpacks and compiles in parallel (torch: 6 s against pip's 22 s here); pip does it
# where uv cannot be installed or cannot install. torch first, from the wheel directories pip is
# told of (find-links in pip's configuration or PIP_FIND_LINKS: a CPU wheel on this disk where
# there is one, which both take before an index's build): with torch 2.13.0 installed, nothing
# later pulls a CUDA build. Then the package with the test, wandb, math, sandbox, ray, lora and
# docs extras at the exact versions CI uses (constraints.txt, inside pyproject.toml's ranges; its
# torch pin is $(TORCH)'s version). Bytecode: compiling every file of the environment (uv's
# --compile-bytecode: 17,000 files, 12 s of both cores) costs more than the suite saves; instead
# the modules every run imports are compiled once here, by importing them, and any other module
# as a process first imports it (where PYTHONDONTWRITEBYTECODE is unset, as make test has it).
WARM_IMPORTS := import reasonrl.cli, reasonrl.controller, transformers.models.llama.modeling_llama, transformers.models.qwen2.modeling_qwen2
EXTRAS := test,wandb,math,sandbox,ray,lora,docs
UV := uv==0.13.8
UV_INSTALL = $(BIN)/uv pip install --quiet --python $(BIN)/python
FIND_LINKS = $(shell $(BIN)/pip config list 2>/dev/null | sed -n "s/.*find-links='\(.*\)'/--find-links \1/p" | sort -u)
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install --quiet '$(UV)' || true
	$(UV_INSTALL) $(FIND_LINKS) $(TORCH) || $(BIN)/pip install --quiet $(TORCH)
	$(UV_INSTALL) -c constraints.txt -e '.[$(EXTRAS)]' \
	  || $(BIN)/pip install --quiet -c constraints.txt -e '.[$(EXTRAS)]'
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -c '$(WARM_IMPORTS)'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/reasonrl demo

# The suite on $(JOBS) pytest-xdist workers, each pinned to a core of its own (tests/conftest.py)
# and each xdist_group on one of them (one Ray cluster at a time), then the tests marked serial,
# which detect hangs and slowdowns by wall time: apart from the rest of the suite, two at a time,
# each on its own core as well.
# Both parts run; make fails if either does (a part that a PYTEST_ADDOPTS filter leaves empty,
# pytest's exit status 5, is no failure). Bytecode caches are written (__pycache__, ignored by git)
# even where the environment sets PYTHONDONTWRITEBYTECODE: the suite starts hundreds of Python
# processes, which would otherwise each compile the package and the tests again.
test: install docs
	unset PYTHONDONTWRITEBYTECODE; status=0; \
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup -m "not serial" --timeout=900 --durations=15; \
	rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || status=1; \
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup -m serial --timeout=900 --durations=5; \
	rc=$$?; [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || status=1; \
	exit $$status

# The docs site in site/: the config and CLI reference pages are generated from the code first,
# and --strict fails on a broken link or anchor.
docs: install
	$(BIN)/python docs/gen_ref.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test-fast: install
	$(BIN)/python -m pytest -q -m "not slow" --timeout=300

clean:
	rm -rf $(VENV) runs .pytest_cache site docs/reference
