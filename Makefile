# For a fresh clone: `make demo`; `make check` in the inner loop (PostgreSQL only); `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: install demo check test lint unit bench profile chaos clean

# The project's own bytecode, written before the demo and the tests start their processes,
# so that each of them reads it instead of compiling every module again: a wheel install
# gets it from pip, an editable one does not, and PYTHONDONTWRITEBYTECODE (set on some CI
# machines) stops Python from keeping what it compiled. Only changed modules are compiled.
PRECOMPILE := $(BIN)/python -m compileall -q -j 0 saga consumers outbox_relay examples tests bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,demo]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PRECOMPILE)
	$(BIN)/saga demo

lint: $(STAMP)
	$(BIN)/ruff check saga consumers outbox_relay tests examples bench .ci
	$(BIN)/ruff format --check saga consumers outbox_relay tests examples bench .ci
	$(BIN)/python .ci/typecheck.py

# The inner loop: lint, mypy and the tests that need no server or only PostgreSQL, except
# the slow ones. A missing PostgreSQL stops it at once.
check: lint
	$(PRECOMPILE)
	$(BIN)/pytest -m "not slow and not rabbitmq and not redis" --require-server postgres \
		--durations=15

# Everything (what CI runs), then the 15 slowest tests.
test: lint
	$(PRECOMPILE)
	$(BIN)/pytest --durations=15

unit: $(STAMP)
	$(BIN)/pytest tests/unit

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,demo,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(PRECOMPILE)
	$(BIN)/python -m bench.run

# CPU per saga of every process at full load; add stacks: make profile PROFILE_ARGS="--py-spy orders"
profile: $(BENCH_STAMP)
	$(PRECOMPILE)
	$(BIN)/python -m bench.profile $(PROFILE_ARGS)

# A few minutes of faults against the example (restarts local PostgreSQL and RabbitMQ).
# Longer: make chaos CHAOS_ARGS="--sagas 3000 --duration 900"
chaos: $(STAMP)
	$(PRECOMPILE)
	$(BIN)/python -m tests.rig.chaos --save $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
