# Two commands do all set-up on a fresh machine:
#   make run   -> venv + packages + models, then the server on 127.0.0.1:8000
#   make test  -> venv + packages + models, then the whole test suite
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Tests use a cache inside the checkout so that repeated runs reuse the converted models.
TEST_CACHE := $(CURDIR)/.cache/homeai
MODELS := smollm2-135m-instruct all-minilm-l6-v2

.PHONY: install pull run test lint bench-engine bench-sim

# Installed modules are byte-compiled by compileall on every core rather than by pip on one (68 -> 50 s
# on the 2-core test box). They must be compiled here: where PYTHONDONTWRITEBYTECODE is set (this box,
# CI) nothing compiled later is kept, and every server a test starts would compile torch again. A
# module that does not compile (a file for another Python in some package) is what pip skips too.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-compile -e '.[test]'
	$(BIN)/python -m compileall -q -j 0 $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") >/dev/null || true
	touch $@

install: $(BIN)/.installed

pull: install
	for m in $(MODELS); do $(BIN)/homeai pull $$m || exit 1; done
	$(BIN)/python -m homeai.runtime.kernels

run: pull
	$(BIN)/homeai serve

# The native kernels build (one compiler process) while the models are pulled. The suite runs in one
# pytest-xdist worker per core, at most 4, a test module per worker at a time (tests/conftest.py): on the
# 2-core box 784 -> 435 s, since one process left a core idle while servers start and clients wait.
# `make test PYTEST_WORKERS=` runs it in one process.
PYTEST_WORKERS ?= -n auto --maxprocesses 4 --dist loadgroup
test: install
	HOMEAI_CACHE_DIR=$(TEST_CACHE) $(BIN)/python -m homeai.runtime.kernels & kernels=$$!; \
	for m in $(MODELS); do HOMEAI_CACHE_DIR=$(TEST_CACHE) $(BIN)/homeai pull $$m || exit 1; done; \
	wait $$kernels
	HOMEAI_CACHE_DIR=$(TEST_CACHE) $(BIN)/python -m pytest -q $(PYTEST_WORKERS) $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check homeai tui tests
	$(BIN)/mypy

bench-engine: pull
	$(BIN)/homeai bench engine --json

bench-sim: install
	$(BIN)/homeai bench sim --trace household --json
