# Two commands matter: `make demo` and `make test`. Both create .venv first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The demo needs only what a node runs; the tests also need the dev tools.
RUN_STAMP := $(VENV)/.installed-run
STAMP     := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck unit bench proto venv clean

$(RUN_STAMP): pyproject.toml
	$(PYTHON) scripts/bootstrap-venv.py $(VENV) --new -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(PYTHON) scripts/bootstrap-venv.py $(VENV) --with-pip -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(RUN_STAMP)
	$(BIN)/rdma-hca demo

lint: $(STAMP)
	$(BIN)/ruff check src tests scripts

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -q

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m rdma_hca.cli bench --out-dir .

proto: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen-proto.sh

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .cache
