# The habits of this project. `make help` lists them.
#
# Every target works in the project's own virtualenv ($(VENV), created on first use) and never
# in the caller's: an active venv's VIRTUAL_ENV is overridden for maturin and every tool is
# called as $(VENV)/bin/... . So `make run` and `make test` behave the same inside an active
# venv, outside one, and on a system Python that refuses `pip install` (PEP 668).
.DEFAULT_GOAL := help
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
# Front-end extras the tests exercise (mini-swe-agent is the heavy one: ~900 MB of deps).
EXTRAS ?= mcp,minisweagent,ray
DIST ?= dist
# The oldest glibc the x86_64 wheel promises; zig links against that glibc's symbol versions.
MANYLINUX ?= manylinux_2_28
WHEEL_TARGET ?= x86_64-unknown-linux-gnu
DEMO := echo "hello from $$(uname -sr)"; ls / | head -3

# maturin and pip would otherwise act on the caller's active venv or conda env. (PATH names
# the venv first so that maturin finds the venv's zig, `python -m ziglang`.)
MATURIN := env -u CONDA_PREFIX VIRTUAL_ENV=$(abspath $(VENV)) PATH=$(abspath $(VENV))/bin:$$PATH \
  $(VENV)/bin/maturin
# A source build needs a Rust toolchain; never let the build backend download one silently.
export MATURIN_NO_INSTALL_RUST := 1
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help rust-toolchain venv build-dev run test test-rust test-python lint wheel bench \
  bench-quick clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-12s %s\n", $$1, $$2}'

rust-toolchain:
	@command -v cargo >/dev/null 2>&1 || { \
	  echo "shellseam: building from source needs a Rust toolchain (cargo, rustc >= 1.85):" \
	       "install it with rustup (https://rustup.rs), then open a new shell" >&2; \
	  exit 1; }

# The venv, with pip >= 25.1 (it installs PEP 735 dependency groups, `--group`) and maturin.
$(VENV)/.venv-ok: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { \
	  echo "shellseam: '$(PYTHON) -m venv' failed; on Debian/Ubuntu: apt install python3-venv" >&2; \
	  rm -rf $(VENV); exit 1; }
	$(PY) -m pip install -q --upgrade 'pip>=25.1'
	$(PY) -m pip install -q 'maturin>=1.9.4,<2'
	@touch $@

# The test and lint tools (dependency group `dev`).
$(VENV)/.dev-ok: $(VENV)/.venv-ok
	$(PY) -m pip install -q --group dev
	@touch $@

venv: $(VENV)/.dev-ok ## create .venv with maturin and the test and lint tools (group `dev`)

build-dev: rust-toolchain venv ## build the extension (release) into .venv with the front-end extras
	$(MATURIN) develop --release -q -E $(EXTRAS)

run: rust-toolchain $(VENV)/.venv-ok ## build shellseam into .venv and run one real command with its CLI
	$(MATURIN) develop --release -q
	@echo '$$ .venv/bin/shellseam run -- '\''$(DEMO)'\'''
	@$(VENV)/bin/shellseam run -- '$(DEMO)' </dev/null

test-rust: rust-toolchain ## cargo test (pure Rust core, no Python needed)
	cargo test --quiet

test-python: build-dev ## pytest (+ hypothesis), every test
	$(PY) -m pytest -q -p no:cacheprovider

test: test-rust test-python ## build, then cargo test and the whole pytest suite

lint: build-dev ## ruff, mypy --strict, stubtest, cargo fmt --check, clippy -D warnings
	$(VENV)/bin/ruff check python tests benches examples
	$(VENV)/bin/ruff format --check python tests benches examples
	$(VENV)/bin/mypy --strict python/shellseam
	$(PY) -m mypy.stubtest shellseam._core
	cargo fmt --check
	cargo clippy --quiet --all-targets -- -D warnings
	cargo clippy --quiet --features python -- -D warnings

# zig (PyPI's `ziglang`) links against $(MANYLINUX)'s glibc symbol versions, so the wheel is
# honest about the oldest glibc it needs; a plain host build would bind the host's (glibc
# 2.34 moved pthread_* and dlsym into libc under new versions). auditwheel checks the result.
wheel: rust-toolchain $(VENV)/.venv-ok ## build the manylinux wheel + sdist into dist/, check with auditwheel
	$(PY) -m pip install -q --group wheel
	rustup target list --installed 2>/dev/null | grep -qx $(WHEEL_TARGET) || rustup target add $(WHEEL_TARGET)
	rm -rf $(DIST)
	$(MATURIN) build --release --locked --strip --zig --target $(WHEEL_TARGET) \
	  --compatibility $(MANYLINUX) --out $(DIST)
	$(MATURIN) sdist --out $(DIST)
	$(VENV)/bin/auditwheel show $(DIST)/*.whl
	@ls -l $(DIST)

bench: build-dev ## the full side-by-side benchmark table
	$(PY) benches/bench.py

bench-quick: build-dev ## the quick benchmark table (CI)
	$(PY) benches/bench.py --quick

clean: ## remove build outputs (.venv stays; `rm -rf .venv` for a fresh one)
	rm -rf target $(DIST) python/shellseam/*.so
