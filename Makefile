# Two commands matter on a fresh machine: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup demo test test-agents agent-clis fcop-mcp soak bench lint typecheck screenshots clean

$(BIN)/.installed: pyproject.toml examples/taskkernel-role-reviewer/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -qq --upgrade pip
	$(BIN)/pip install -qq -e '.[dev]'
	$(BIN)/pip install -qq -e examples/taskkernel-role-reviewer
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/taskkernel demo

test: setup fcop-mcp
	$(BIN)/python -m pytest -q -n auto

# fcop-mcp 4.0.5, the tests' real fcop agent server (tests/fcop_mcp.py), in a venv of its own: it pins an older mcp.
FCOP_MCP_VENV := .venv-fcop-mcp
fcop-mcp: $(FCOP_MCP_VENV)/bin/fcop-mcp
$(FCOP_MCP_VENV)/bin/fcop-mcp:
	$(PYTHON) -m venv $(FCOP_MCP_VENV)
	$(FCOP_MCP_VENV)/bin/pip install -qq fcop-mcp==4.0.5

# The real agent CLIs the tests drive, at the versions tests/clis/package.json pins (docs/agents.md, "Versions").
# npm install, not npm ci: the registry lacks some platform packages other machines would use, which npm ci refuses.
agent-clis: tests/clis/node_modules/.installed
tests/clis/node_modules/.installed: tests/clis/package.json tests/clis/package-lock.json
	npm install --prefix tests/clis --no-audit --no-fund --loglevel=error
	touch $@

test-agents: setup agent-clis  # only the real agent CLIs' tests
	$(BIN)/python -m pytest -q -n auto -m agent_clis tests/test_real_clis.py tests/test_run_stream.py

screenshots: setup  # the board's pictures in docs/img, taken by its browser tests
	TASKKERNEL_SCREENSHOTS=docs $(BIN)/python -m pytest -q tests/test_web_browser.py

soak: setup
	$(BIN)/python -m pytest -q -m soak

bench: setup
	$(BIN)/python bench/kernel.py
	$(BIN)/python bench/sessionlog.py
	$(BIN)/python bench/scheduler.py
	$(BIN)/python bench/gate.py
	$(BIN)/python bench/ingest_files.py
	$(BIN)/python bench/ingest.py
	$(BIN)/python bench/cli.py
	$(BIN)/python bench/reads.py
	$(BIN)/python bench/mcp.py
	$(BIN)/python bench/mcp_startup.py
	$(BIN)/python bench/team.py
	$(BIN)/python bench/worktrees.py
	$(BIN)/python bench/serve.py
	$(BIN)/python bench/resume.py

lint: setup
	$(BIN)/ruff check kernel roles scheduler coordinator taskkernel tests bench examples

typecheck: setup
	$(BIN)/mypy -p taskkernel

clean:
	rm -rf $(VENV) $(FCOP_MCP_VENV) .pytest_cache .hypothesis
