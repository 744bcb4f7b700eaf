# Two entry points: `make serve` (the server on the embedded default model) and `make test` (the suite).
# Both create .venv on first use. TORCH pins the build pip takes (on CPU-only machines the local CPU wheel).
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv serve test lint

$(BIN)/flint: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(BIN)/flint

venv: $(BIN)/flint

serve: venv
	$(BIN)/flint-serve $(ARGS)

# The venv's bin/ on PATH: tests call tools pip installs there (hadolint, shellcheck, flint, flint-serve).
test: venv
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -q -m "not gpu" -n 2 --dist loadgroup $(ARGS)

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
