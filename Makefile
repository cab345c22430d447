# Two commands for a fresh clone: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: install demo test lint unit bench profile chaos clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,demo]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/saga demo

lint: $(STAMP)
	$(BIN)/ruff check saga consumers outbox_relay tests examples bench
	$(BIN)/ruff format --check saga consumers outbox_relay tests examples bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest

unit: $(STAMP)
	$(BIN)/pytest tests/unit

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,demo,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run

# CPU per saga of every process at full load; add stacks: make profile PROFILE_ARGS="--py-spy orders"
profile: $(BENCH_STAMP)
	$(BIN)/python -m bench.profile $(PROFILE_ARGS)

# A few minutes of faults against the example (restarts local PostgreSQL and RabbitMQ).
# Longer: make chaos CHAOS_ARGS="--sagas 3000 --duration 900"
chaos: $(STAMP)
	$(BIN)/python -m saga.examples.order_saga.chaos --save $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
