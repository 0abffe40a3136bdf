# Two commands matter on a fresh machine: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test soak bench lint typecheck clean

$(BIN)/.installed: pyproject.toml examples/taskkernel-role-reviewer/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q -e examples/taskkernel-role-reviewer
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/taskkernel demo

test: setup
	$(BIN)/python -m pytest -q -n auto

soak: setup
	$(BIN)/python -m pytest -q -m soak

bench: setup
	$(BIN)/python bench/kernel.py
	$(BIN)/python bench/sessionlog.py
	$(BIN)/python bench/scheduler.py
	$(BIN)/python bench/gate.py
	$(BIN)/python bench/ingest_files.py
	$(BIN)/python bench/ingest.py

lint: setup
	$(BIN)/ruff check kernel roles scheduler tests bench

typecheck: setup
	$(BIN)/mypy kernel roles scheduler

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
