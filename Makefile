# The two commands of the course: `make book` and `make test`.
# Both create .venv on first use and (re)install the pinned stack only when
# requirements.lock has changed since the last install.

PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-lock
TRITON_STAMP := $(VENV)/.installed-triton
NPM_STAMP := node_modules/.installed-lock
WHEELHOUSE := $(VENV)/wheelhouse
WHEELHOUSE_STAMP := $(WHEELHOUSE)/.requirements-learner.txt

.PHONY: book test test-setup triton-then-book test-fast lint venv bench clean help

help:
	@echo "make book   build the website into _build/html (chapters executed, cached)"
	@echo "make test   build the book, then run the whole test suite"
	@echo "make test-fast  library and autograder-check tests only (no book, browser or grading runs)"
	@echo "make lint   ruff, vulture (dead code) and, where installed, duplicates (pyproject.toml)"
	@echo "make bench  run the benchmark scripts and print their tables"
	@echo "make clean  remove the build output (keeps .venv)"

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements.lock
	$(BIN)/python -m pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	cp requirements.lock $(STAMP)

# The Triton backend (~1 GB, requirements-triton.lock) is for the tests only, never the book:
# installed on top of the pinned stack, again only when its lock file has changed.
$(TRITON_STAMP): requirements-triton.lock $(STAMP)
	$(BIN)/python -m pip install --disable-pip-version-check -q -r requirements-triton.lock
	cp requirements-triton.lock $(TRITON_STAMP)

# axe-core for the accessibility checks of the browser tests, and configurable-http-proxy for
# the JupyterHub of the grading-service tests (package-lock.json, exact versions, no install
# scripts): reinstalled only when the lock file has changed. Without npm those tests skip
# (with a hint) and the rest of the suite still runs.
$(NPM_STAMP): package.json package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
	  npm ci --ignore-scripts --no-audit --no-fund && cp package-lock.json $(NPM_STAMP); \
	else \
	  echo "npm not found: the accessibility checks and the JupyterHub tests will skip (apt-get install nodejs npm)"; \
	fi
# The learner's packages (requirements-learner.txt, a complete list: --no-deps) as wheels, for
# tests/book/test_learner_env.py, which makes a venv from them and the site's downloads with
# `pip install --no-index` (once per set of downloads, kept in .venv/learner-envs): downloaded once here, again only when the file changes, never by a
# test. The torch pin takes whichever build the index serves: put the CPU-only wheel within
# pip's reach (e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) to skip CUDA's GBs.
$(WHEELHOUSE_STAMP): requirements-learner.txt $(STAMP)
	$(BIN)/python -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
		-r requirements-learner.txt -d $(WHEELHOUSE)
	cp requirements-learner.txt $(WHEELHOUSE_STAMP)

book: $(STAMP)
	$(BIN)/python -m scripts.build_book

# What the suite needs, the steps that do not depend on each other at once: npm beside the
# pinned stack's install; then the book, Triton and the learner wheelhouse side by side.
# Triton goes in before the book runs, never while a chapter imports torch (a half-written
# package in site-packages). --output-sync keeps each step's lines together.
test-setup:
	$(MAKE) --no-print-directory -j3 --output-sync=target $(NPM_STAMP) $(WHEELHOUSE_STAMP) triton-then-book

triton-then-book: $(TRITON_STAMP)
	$(MAKE) --no-print-directory book

# One pytest-xdist worker per core, a test file per worker at a time (--dist loadfile: a
# module's graded class is made once; tests/conftest.py hands out the longest files first).
# A test that looks for what a run left behind looks for that run's own folders and
# cgroups, by its id (tests/leftovers.py), so every test can run beside the others. The
# slowest tests are listed at the end.
test: test-setup
	$(BIN)/python -m pytest -n auto --dist loadfile --no-loadscope-reorder --durations=25

# No book build, no browser, no end-to-end grading (the `slow` marker), one pytest-xdist
# worker per core: under a minute on 2 cores.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n auto -m "not slow and not browser" \
		--ignore=tests/book/test_book.py --ignore=tests/book/test_site_browser.py \
		--ignore=tests/grader/test_grading_e2e.py

# ruff (rules in pyproject.toml [tool.ruff]); vulture, the dead-code check, which fails on any
# finding (paths and confidence in [tool.vulture], names used where it cannot see in
# vulture_whitelist.py); then, where the team's `duplicates` is on PATH, the places that repeat
# six or more lines (a list to read, never a failure).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/vulture
	@if command -v duplicates >/dev/null 2>&1; then duplicates; \
	else echo "duplicates is not on PATH: the repeated-code listing is skipped"; fi

bench: $(STAMP)
	for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf _build
