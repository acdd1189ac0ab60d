# The two set-up commands of the README.  Both create ./.venv and install the project
# into it on first use (re-installing when pyproject.toml changes).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: $(VENV)/.installed          ## run the daemon on the embedded default (local broker + real corpus)
	$(BIN)/streamtopics demo

test: $(VENV)/.installed          ## the test suite (real Kafka-protocol broker on loopback)
	$(BIN)/python -m pytest -q -m "not slow"

bench: $(VENV)/.installed         ## benchmarks against peers (installs the bench extra)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python bench/bench_core.py

clean:
	rm -rf $(VENV) var
