# Two commands matter: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck unit bench proto venv clean

$(STAMP): pyproject.toml
	$(PYTHON) scripts/bootstrap-venv.py $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/rdma-hca demo

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m rdma_hca.tools.cli bench --out-dir .

proto: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen-proto.sh

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .cache
