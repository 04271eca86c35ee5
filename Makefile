# The two commands of the README: `make run` (set up, run the main job) and `make test`;
# `make docs` builds the user guide's site.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run lint docs jvm-archives test bench clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(PY) -m pybk demo

# The gate every change passes first: ruff, then mypy (settings in pyproject.toml; mypy
# keeps its cache in .mypy_cache, so a second run takes a second or two).
lint: $(VENV)/.installed
	$(PY) -m ruff check pybk tests benchmarks examples docs/hooks
	$(PY) -m mypy pybk docs/hooks

# The user guide (mkdocs.yml, docs/): a site in site/.  --strict (also set in mkdocs.yml)
# makes every warning an error: a broken link or anchor, a page left out of the
# navigation, a docstring the API reference cannot read.  NO_MKDOCS_2_WARNING quiets
# Material's banner about MkDocs 2.0, which says nothing about this build.  Not --quiet:
# it hides the warnings, and --strict then passes whatever they said.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

docs: $(VENV)/.installed
	$(MKDOCS) build --strict

# The class-data archives of the tests' JVMs (tests/jvm_archives.py): made once per
# environment, in a JVM of each kind (ZooKeeper, Spark), so that the dozens the tests
# start map their classes instead of loading them from the jars (a quarter less CPU for
# a Spark application).  Nothing to do once they exist.
jvm-archives: $(VENV)/.installed
	$(PY) tests/jvm_archives.py

# Lint, the guide and the archives are made side by side (each takes one core), then
# two pytest-xdist workers.  Counted in a cgroup (so that the JVMs' CPU is in), the run
# keeps two cores about two thirds busy: 1,150 s of CPU in 14 minutes, 40% of it Spark's
# JVMs and Python workers; a third worker (PYTEST_WORKERS=3) took 10% off the wall time
# for 10% more CPU.  --dist loadfile keeps each file on one worker, so that a module's
# fixtures (its cluster of bookies) start once, and the workers take the files in
# collection order, which puts the long ones first (tests/conftest.py).  Each worker
# has its own ZooKeeper server and SparkSession, shared by its files.
# `make test PYTEST_WORKERS=0` runs in one process.
PYTEST_WORKERS ?= 2

test: $(VENV)/.installed
	$(MAKE) --no-print-directory -j 3 lint docs jvm-archives
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(PY) benchmarks/storage_bench.py --quick
	$(PY) benchmarks/wal_bench.py --quick
	$(PY) benchmarks/cluster_bench.py --quick
	$(PY) benchmarks/rereplication_bench.py --quick

clean:
	rm -rf $(VENV) build site *.egg-info .mypy_cache .ruff_cache
