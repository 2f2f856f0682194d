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

# Two workers: the tests mostly wait on timers and sockets, so two share the machine's
# cores well; a file's tests stay together, in order, on one worker (--dist loadfile).
# The run's own short --basetemp: unix socket paths are limited to 107 bytes, and the
# shared /tmp/pytest-of-<user> would have this run delete other runs' old directories.
# Kept when a test failed, for a look at what it left; else removed in the background (a
# run leaves over a GB of small files, and removing them can take minutes on a busy disk).
unit: $(STAMP)
	@base=$$(mktemp -d /tmp/rh-test.XXXXXX) && \
	  $(BIN)/pytest -q -n 2 --dist loadfile --basetemp="$$base"; \
	  status=$$?; \
	  if [ $$status -eq 0 ]; then (rm -rf "$$base" >/dev/null 2>&1 &); \
	  else echo "test files kept in $$base"; fi; \
	  exit $$status

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python -m rdma_hca.cli bench --out-dir .

proto: $(STAMP)
	PYTHON=$(BIN)/python scripts/gen-proto.sh

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .cache
