# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LISTEN ?= 127.0.0.1:7420
DATA   ?= var

.PHONY: run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/rsd --listen $(LISTEN) --data-dir $(DATA)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python -m bench.codec
	$(BIN)/python -m bench.claims
	$(BIN)/python -m bench.pools
	$(BIN)/python -m bench.tasks
	$(BIN)/python -m bench.renewals
	$(BIN)/python -m bench.durability all

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
