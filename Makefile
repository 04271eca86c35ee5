# The two commands of the README: `make run` (set up, run the main job) and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: run test bench clean

$(VENV)/.installed: setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

run: $(VENV)/.installed
	$(PY) -m pybk demo

test: $(VENV)/.installed
	$(PY) -m pytest -q tests

bench: $(VENV)/.installed
	$(PY) benchmarks/storage_bench.py --quick
	$(PY) benchmarks/wal_bench.py --quick
	$(PY) benchmarks/cluster_bench.py --quick
	$(PY) benchmarks/rereplication_bench.py --quick

clean:
	rm -rf $(VENV) build *.egg-info
