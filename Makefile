# The habits of this project. `make help` lists them.
.DEFAULT_GOAL := help
VENV ?= .venv
PY := $(VENV)/bin/python
EXTRAS ?= dev,mcp,minisweagent

.PHONY: help venv build-dev test test-rust test-python lint bench bench-quick clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-12s %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q 'maturin>=1.5,<2'

venv: $(PY) ## create the virtualenv with maturin

build-dev: venv ## build the extension (release) into the venv with the test extras
	$(VENV)/bin/maturin develop --release -q -E $(EXTRAS)

test-rust: ## cargo test (pure Rust core, no Python needed)
	cargo test --quiet

test-python: build-dev ## pytest (+ hypothesis)
	$(PY) -m pytest -q -p no:cacheprovider

test: test-rust test-python ## build, then cargo test and pytest

lint: build-dev ## ruff, mypy --strict, stubtest, cargo fmt --check, clippy -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy --strict python/shellseam
	$(VENV)/bin/python -m mypy.stubtest shellseam._core
	cargo fmt --check
	cargo clippy --quiet --all-targets -- -D warnings
	cargo clippy --quiet --features python -- -D warnings

bench: build-dev ## the full side-by-side benchmark table
	$(PY) benches/bench.py

bench-quick: build-dev ## the quick benchmark table (CI)
	$(PY) benches/bench.py --quick

clean: ## remove build outputs
	rm -rf target python/shellseam/*.so
