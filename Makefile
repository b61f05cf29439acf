# Development entry points. Two commands are enough:
#   make run    # venv, PostgreSQL + Redis, migrations, demo data, then web + worker + beat
#   make test   # venv, PostgreSQL + Redis, import contracts, pytest
# See docs/_readme_running.md (README, "Running") for the details.

SHELL := /bin/bash
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ENV_FILE := .data/services.env
# Load the URLs written by `scripts/services.py ensure`; must sit on the same recipe line as the command.
LOAD_ENV := set -a; . ./$(ENV_FILE); set +a
RUN_SETTINGS ?= config.django.local
PORT ?= 8000
PYTEST_ARGS ?=

.PHONY: help ports venv services migrate demo run test stop screenshots

# Before minutes of setup: the web and demo receiver ports are free (each refusal names the variable that moves it).
ports:
	PORT=$(PORT) $(PYTHON) scripts/run.py --check-ports

help:
	@echo "make run      start everything (web on http://127.0.0.1:$(PORT)/admin/, worker, beat)"
	@echo "make test     import contracts + pytest (PYTEST_ARGS='-x -q' to pass options)"
	@echo "make stop     stop the private PostgreSQL/Redis servers started under .data/"
	@echo "make bench    quick benchmarks against bench/budgets.json (docs/benchmarks.md)"
	@echo "make hostile  10,000 generated hostile requests over HTTP against the real processes"
	@echo "make screenshots  regenerate docs/operator-guide/*.png (the browser tests with SCREENSHOT_DIR set)"
	@echo "other targets: venv services migrate demo prove-fallback bench-outbound bench-mix bench-rate bench-burst bench-clients bench-admission"

venv: $(STAMP)

# Re-install only when pyproject.toml is newer than the stamp.
$(STAMP): pyproject.toml
	@if [ ! -x $(VPY) ]; then \
	  $(PYTHON) -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 13)))' \
	    || { echo "make: $(PYTHON) is not Python 3.11/3.12; run e.g. make PYTHON=python3.11 $(MAKECMDGOALS)" >&2; exit 1; }; \
	  echo "creating $(VENV) with $$($(PYTHON) --version)"; \
	  $(PYTHON) -m venv $(VENV); \
	fi
	$(VPY) -m pip install -e '.[test]'
	@touch $@

services: venv
	$(VPY) scripts/services.py ensure

# Migrations run as the database owner; the post-migrate step grants the application role exactly its table
# privileges (docs/security.md). Everything else (demo, web, worker, beat) connects as the application role.
AS_OWNER := DATABASE_URL="$$DATABASE_OWNER_URL" JOURNAL_DATABASE_URL="$$JOURNAL_DATABASE_OWNER_URL"
migrate: services
	$(LOAD_ENV); $(AS_OWNER) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py migrate --database default --noinput
	$(LOAD_ENV); $(AS_OWNER) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py migrate --database journal --noinput

demo: migrate
	$(LOAD_ENV); DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py demo_load
	$(LOAD_ENV); DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py delivery_demo

# The web process is gunicorn (config/gunicorn.py); RUN_ARGS=--dev selects Django's runserver instead.
RUN_ARGS ?=
run: ports venv services migrate demo
	$(LOAD_ENV); DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py collectstatic --noinput -v 0
	$(LOAD_ENV); DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) PORT=$(PORT) exec $(VPY) scripts/run.py $(RUN_ARGS)

# pytest takes config.django.test from pyproject.toml, so a DJANGO_SETTINGS_MODULE in the caller's
# environment must not override it.
# `ensure --test`: the suite's explicit trade of durability for speed (D-410): our private PostgreSQL runs with fsync,
# full_page_writes and synchronous_commit off unless make run is using it; `make run` makes it durable again.
test: venv
	$(VPY) scripts/services.py ensure --test
	scripts/ensure_chromium.sh
	$(LOAD_ENV); $(VENV)/bin/lint-imports
	@# The whole suite runs as two shards side by side (scripts/test_shards.py: own test databases and Redis
	@# database each); a selection (PYTEST_ARGS=...) runs one plain pytest.
	$(LOAD_ENV); unset DJANGO_SETTINGS_MODULE; if [ -z "$(PYTEST_ARGS)" ]; then $(VPY) scripts/test_shards.py -q; \
	  else $(VPY) -m pytest $(PYTEST_ARGS); fi

# Every picture of docs/operator-guide.md: the browser tests (the walk of every screen as every role among them,
# tests/browser/walk.py) on the demo world, writing their screenshots there, 1,400 px wide (D-502).
SCREENSHOT_TESTS ?= tests/browser
screenshots: venv
	$(VPY) scripts/services.py ensure --test
	scripts/ensure_chromium.sh
	$(LOAD_ENV); unset DJANGO_SETTINGS_MODULE; SCREENSHOT_DIR=$(CURDIR)/docs/operator-guide \
	  $(VPY) -m pytest $(SCREENSHOT_TESTS) -q -p no:randomly

# Benchmarks, each on its own throwaway databases (about 20 minutes): the hot-account mix with 1 and 2 clients
# against bench/budgets.json (--check fails naming each broken budget figure), the retained-history latency
# check, the whole-service activation at 1,000 accounts, the /metrics queries over 1,000,000 retained receipts
# (--check: flat buffers, about 5 minutes of it generating the history) and the metrics and tracing overhead
# over the hot-account mix (reported; docs/benchmarks.md), the halt drain after the last settlement (issue 20 goal
# 5, --check against its 200 ms p99 goal, about 90 s), and bench-outbound, bench-mix and bench-rate below (issue
# 20, goals 1 to 4, each --check against the goal itself; about 8 minutes together). The test suite runs
# small versions of each on its own test database; the sizes that take minutes live here.
# Full runs and how the budgets were chosen: docs/benchmarks.md ("The test suite and the benches").
.PHONY: bench
# The benchmarks create and drop their own throwaway databases: they run as the administrator.
AS_ADMIN := DATABASE_URL="$$DATABASE_ADMIN_URL" JOURNAL_DATABASE_URL=
bench: venv services
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench hot-account --quick --check
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench history --sizes 10,20000 --iterations 150 --check
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench activation --scenario all --accounts 1000 --check
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench metrics-plans --sizes 1000,1000000 --check
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench overhead --clients 2 --seconds 10 --pairs 4
	$(LOAD_ENV); unset DJANGO_SETTINGS_MODULE; LIST_PLANS_RECEIPTS=100000 $(VPY) -m pytest -q -p no:randomly tests/governance/test_list_plans.py
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench halt-drain --drills 40 --period 1.0 --effects 9000 --check
	$(MAKE) bench-outbound
	$(MAKE) bench-mix
	$(MAKE) bench-rate
	$(MAKE) bench-burst
	$(MAKE) bench-clients
	$(MAKE) bench-admission

# Issue 40, goals 1-3: 1,000 single-event signed deliveries from 8 clients through make run's processes, on a database
# migrated seconds before and again after ANALYZE, to the last finalized effect (each once at the receiver), --check
# against bench/budgets.json "burst" (the goals themselves: 200 events/s end to end, 8 ms of product CPU per event,
# first minute >= 0.8x analyzed). About 4 minutes.
.PHONY: bench-burst
bench-burst: venv services
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench burst --deliveries 1000 \
	  --clients 8 --phases cold,analyzed --check

# Issue 40, goal 5: the burst at 1, 2, 4, 8 and 16 posting clients on the analyzed database (one run.py, one phase per
# count), its JSON in bench/results/ and the chart docs/benchmarks.md shows (bench/burst_sweep.py). About 4 minutes.
.PHONY: bench-clients
bench-clients: venv services
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench burst --deliveries 500 \
	  --clients 1,2,4,8,16 --phases analyzed --json bench/results/burst-clients.json \
	  --chart docs/benchmarks/burst-clients.svg

# Issue 40, goal 4: admission only against the raw psycopg loop at 8 clients, --check against
# bench/budgets.json "hot_account" admission_only_over_raw_floor (1.0, the goal). About 2 minutes.
.PHONY: bench-admission
bench-admission: venv services
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench hot-account --clients 8 \
	  --seconds 10 --no-peer --batch-events 0 --check

# Issue 20, goal 2: the hot-account mix the way the product runs it (8 client processes admitting, make run's
# worker roles finalizing each event's effect), --check against the goal's 100 completions/s (D-389, D-403).
# About 2 minutes.
.PHONY: bench-mix
bench-mix: venv services
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench hot-account --clients 8 \
	  --seconds 20 --drills 4 --no-peer --product-only --check

# Issue 20, goal 4: a destination declared at 50 requests/s and 4 in flight, 2 egress processes for 30 s, a 429
# Retry-After 2, against bench/budgets.json "outbound_rate" (the goal itself). About 1.5 minutes.
.PHONY: bench-rate
bench-rate: venv services
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench outbound-rate --check

# Issue 20, goals 1 and 3: the egress dispatch loop (8 processes) against an at-least-once procrastinate baseline
# POSTing to the same receiver, 2 rounds of 20 s phases, --check against bench/budgets.json "outbound" (the goals
# themselves). Part of `make bench` since the batched egress step meets them (D-343, D-352). About 4 minutes.
.PHONY: bench-outbound
bench-outbound: venv services
	$(LOAD_ENV); $(AS_ADMIN) DJANGO_SETTINGS_MODULE=$(RUN_SETTINGS) $(VPY) manage.py bench outbound --workers 8 \
	  --seconds 20 --warm 3 --rounds 2 --effects 9000 --baseline-jobs 14000 --check

# The whole suite (minus `slow`) in a fresh clone of the committed HEAD on private PostgreSQL and Redis started on
# two free loopback ports (scripts/prove_fallback.sh). `make test` runs a slice of it there
# (tests/test_bootstrap_fallback.py); this is the full version, about as long as `make test` itself.
.PHONY: prove-fallback
prove-fallback:
	PYTEST_ARGS="$(or $(PYTEST_ARGS),-q -m 'not slow')" bash scripts/prove_fallback.sh

# The hostile-input suite over HTTP against make run's real processes at full size: 10,000 generated requests
# (the test suite sends 600). About 6 minutes on a 2-core machine; figures in docs/benchmarks.md.
.PHONY: hostile
hostile: venv services
	$(LOAD_ENV); unset DJANGO_SETTINGS_MODULE; HOSTILE_REQUESTS=$${HOSTILE_REQUESTS:-10000} $(VPY) -m pytest -q -s \
	  -p no:cacheprovider tests/hostile/test_hostile_http.py

stop:
	@if [ -x $(VPY) ]; then $(VPY) scripts/services.py stop; else $(PYTHON) scripts/services.py stop; fi
