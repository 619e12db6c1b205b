# django-sqlqueue development tasks.
#
#   make demo          run the example project (SQLite, no database drivers needed)
#   make demo-embedded the example project served by uvicorn with the queue worker inside
#                      the web process (example_project/asgi.py; SQLite)
#   make admin         serve the example project's admin (some lag, a dead letter) on
#                      ADMIN_ADDRESS (default 127.0.0.1:8000); log in as admin / admin
#   make test          ruff, mypy, migration check, then pytest on SQLite, MariaDB and
#                      PostgreSQL at once (and with CI=true the Python 3.11 + Django 5.2
#                      run: migrations, checks and publishing, and on SQLite the task
#                      worker's tests) and the docs check; in the matrix's tail, once
#                      the load falls, the 30 s failover runs; then a 60 s chaos run on
#                      MariaDB, alone (it restarts the server)
#   make test-full     the whole matrix one run after another, for a release: every
#                      backend on both interpreters, in full
#   make test-compat   only the Python 3.11 + Django 5.2 run, on all three backends
#   make test-wheel    build the sdist and the wheel, install the wheel into a fresh
#                      virtualenv and run the example project on it (SQLite)
#   make test-durations  keep the last make test's time per test file in
#                      tests/durations.json (tests/shard.py deals each backend's suite
#                      into parts of about equal time by them)
#   make lint          ruff + mypy
#   make docs          build the documentation site into site/ (MkDocs, strict: a broken
#                      link or reference fails); make docs-serve serves it on DOCS_ADDRESS
#                      (default 127.0.0.1:8001), rebuilding on every change
#   make docs-check    the strict build and the tutorial's and how-to guides' Python
#                      samples, run in order against a throwaway SQLite project (make test
#                      runs it after lint)
#   make bench         benchmarks/run.py against BENCH_DATABASE_URL (default: MariaDB)
#   make bench-spark   the Spark data source: 1,000,000 rows bulk-published and read back
#                      (local[2]) against BENCH_DATABASE_URL (default: MariaDB)
#   make pgbouncer     PgBouncer (transaction pooling) in front of the local PostgreSQL;
#                      prints its URL; make pgbouncer-stop stops it
#   make chaos         workers and publishers under faults for CHAOS_SECONDS (default 180)
#                      against CHAOS_DATABASE_URL (default: MariaDB), then a loss report;
#                      make test runs a 60 s version of it on MariaDB
#   make chaos-failover  the chaos run on a fresh PostgreSQL pair whose primary fails over,
#                      then on a fresh Galera cluster whose writer node is killed, each for
#                      CHAOS_FAILOVER_SECONDS (default 180); chaos-failover-short runs
#                      30 s of each; chaos-galera-spread runs the workers on all
#                      three Galera nodes at once
#   make cluster-pg    a PostgreSQL primary and a synchronous replica on ports 25432 and
#                      25433 (clusters/pg.py); prints their URLs. cluster-pg-stop stops it
#   make cluster-galera  three MariaDB Galera nodes behind HAProxy (one writer node) on
#                      23060-23063 (clusters/galera.py); cluster-galera-stop stops it
#   make mariadb-second  a second MariaDB server on port 23306 (clusters/mariadb.py), for
#                      topics on a server of their own; mariadb-second-stop stops it
#   make provision     install mysqlclient's build packages, start MariaDB and PostgreSQL
#                      (test and bench do this first; PROVISION=0 skips it)
#   make clean         remove virtualenvs, test databases and caches
#
# Variables: PYTEST_ARGS (passed to pytest), BACKENDS (default "sqlite mysql postgres"),
# SQLITE_URL / MYSQL_URL / POSTGRES_URL (and COMPAT_*_URL for the Python 3.11 run, which
# runs at the same time and so needs databases of its own), BASE_PYTHON / COMPAT_PYTHON,
# CHAOS_SECONDS / CHAOS_DATABASE_URL / CHAOS_ARGS (e.g. "--seed 7 --keep"),
# CHAOS_FAILOVER_SECONDS, SQLQUEUE_PG_CLUSTER_PORT / SQLQUEUE_GALERA_CLUSTER_PORT,
# SQLQUEUE_READ_REPLICA_PORT (the PostgreSQL pair tests/test_read_replica.py starts in the
# PostgreSQL suite; default 25442 and 25443).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
.NOTPARALLEL:
.SUFFIXES:

export PIP_DISABLE_PIP_VERSION_CHECK := 1

PYENV_VERSIONS ?= $(or $(PYENV_ROOT),$(if $(HOME),$(HOME)/.pyenv,/root/.pyenv))/versions

# --------------------------------------------------------------------------- interpreters

# .venv: the newest Python 3.13/3.12 that actually starts (pyenv installs shims for every
# version, and a shim for a version that is not selected fails), with Django 6.1.
# Otherwise python3 with Django 5.2.
ifndef BASE_PYTHON
BASE_PYTHON := $(shell \
  for minor in 13 12; do \
    for p in $$(ls -d $(PYENV_VERSIONS)/3.$$minor*/bin/python 2>/dev/null | sort -rV) \
             $$(command -v python3.$$minor 2>/dev/null); do \
      if "$$p" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then \
        "$$p" -c 'import sys; print(sys.executable)'; exit 0; \
      fi; \
    done; \
  done; \
  python3 -c 'import sys; print(sys.executable)' 2>/dev/null)
endif
BASE_INFO := $(shell $(BASE_PYTHON) -c 'import platform, sys; print(platform.python_version(), int(sys.version_info >= (3, 12)))' 2>/dev/null)
BASE_VERSION := $(word 1,$(BASE_INFO))
DJANGO_SERIES ?= $(if $(filter 1,$(word 2,$(BASE_INFO))),6.1,5.2)

# .venv-py311: Python 3.11 with Django 5.2, for the compatibility run.
ifndef COMPAT_PYTHON
COMPAT_PYTHON := $(shell \
  for p in $$(command -v python3 2>/dev/null) \
           $$(ls -d $(PYENV_VERSIONS)/3.11*/bin/python 2>/dev/null | sort -rV) \
           $$(command -v python3.11 2>/dev/null); do \
    if "$$p" -c 'import sys, venv; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; then \
      "$$p" -c 'import sys; print(sys.executable)'; exit 0; \
    fi; \
  done)
endif
COMPAT_VERSION := $(if $(COMPAT_PYTHON),$(shell $(COMPAT_PYTHON) -c 'import platform; print(platform.python_version())' 2>/dev/null))
COMPAT_DJANGO_SERIES := 5.2

VENV := .venv
PY := $(VENV)/bin/python
COMPAT_VENV := .venv-py311
COMPAT_PY := $(COMPAT_VENV)/bin/python

# --------------------------------------------------------------------------- settings

ROOT := $(CURDIR)
TEST_DATA := $(ROOT)/.test-data
SQLITE_URL ?= sqlite:///$(TEST_DATA)/sqlqueue.sqlite3
MYSQL_URL ?= mysql://root@127.0.0.1:3306/test
POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/test
COMPAT_SQLITE_URL ?= sqlite:///$(TEST_DATA)/compat.sqlite3
COMPAT_MYSQL_URL ?= mysql://root@127.0.0.1:3306/compat
COMPAT_POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/compat
# make test runs the tests that start a Spark session (marked spark) once, against MariaDB
# in a database of their own, beside the suites; every backend runs the data source
# without a JVM (tests/test_spark_protocol.py).
SPARK_URL ?= mysql://root@127.0.0.1:3306/spark
# What the Python 3.11 run covers on MariaDB and PostgreSQL under make test: the
# migrations, the system checks and publishing (the rest runs there on Python 3.13).
COMPAT_SMOKE_TESTS ?= tests/test_migrations.py tests/test_migration_partitions.py \
  tests/test_migration_heartbeat_groups.py tests/test_checks.py tests/test_publish.py
# ... and on SQLite: those, and the files holding tests marked compat (the task worker,
# whose Tasks framework comes from the django-tasks backport on Django 5.2, and a worker's
# lifecycle), with their tests that start no worker process besides. Every other test runs
# on all three backends on Python 3.13; make test-compat and test-full run them all on
# Python 3.11 too. The whole suite here cost CI 2-3 minutes of its 15.
COMPAT_FILES := $(shell grep -l 'mark.compat' tests/test_*.py 2>/dev/null)
COMPAT_SQLITE_SELECTION ?= -m "not spark and (not worker or compat)" $(COMPAT_SMOKE_TESTS) $(COMPAT_FILES)
BACKENDS ?= sqlite mysql postgres
BENCH_DATABASE_URL ?= $(or $(DATABASE_URL),$(MYSQL_URL))
PYTEST_ARGS ?=
BENCH_ARGS ?=
CHAOS_DATABASE_URL ?= $(or $(DATABASE_URL),$(MYSQL_URL))
CHAOS_SECONDS ?= 180
CHAOS_SHORT_SECONDS ?= 60
CHAOS_FAILOVER_SECONDS ?= 180
CHAOS_FAILOVER_SHORT_SECONDS ?= 30
CHAOS_ARGS ?=
PROVISION ?= 1

LINT_PATHS := $(wildcard django_sqlqueue tests example_project benchmarks clusters docs)
IS_CI := $(filter 1 true True TRUE yes on,$(CI))

# --------------------------------------------------------------------------- helpers

# $(call ensure_venv,<dir>,<python>,<python version>,<Django series>): (re)create <dir>
# from <python> unless it already was made from exactly that interpreter.
define ensure_venv
	@if [ -z "$(2)" ]; then echo "sqlqueue: no suitable Python found for $(1)" >&2; exit 1; fi
	@echo "sqlqueue: using $(2) (Python $(3)) with Django $(4)"
	@want='$(2) $(3) Django-$(4)'; \
	if [ ! -x $(1)/bin/python ] || [ "$$(cat $(1)/.sqlqueue-python 2>/dev/null)" != "$$want" ]; then \
	  echo "sqlqueue: creating $(1)"; \
	  rm -rf $(1); \
	  $(2) -m venv $(1); \
	  echo "$$want" > $(1)/.sqlqueue-python; \
	fi
endef

# $(call run_suite,<venv python>,<title>): pytest once per backend in $(BACKENDS), then a
# summary. Unreachable servers fail under CI=true and are skipped (loudly) otherwise.
# Exits with the first non-zero pytest exit code.
define run_suite
	@mkdir -p $(TEST_DATA)
	@status=0; summary=""; \
	for backend in $(BACKENDS); do \
	  case "$$backend" in \
	    sqlite)   name=SQLite;     url='$(SQLITE_URL)' ;; \
	    mysql)    name=MariaDB;    url='$(MYSQL_URL)' ;; \
	    postgres) name=PostgreSQL; url='$(POSTGRES_URL)' ;; \
	    *) echo "sqlqueue: unknown backend '$$backend' (expected sqlite, mysql or postgres)" >&2; exit 2 ;; \
	  esac; \
	  echo; \
	  echo "==================== $(2): $$name ($$url) ===================="; \
	  if [ "$$backend" != sqlite ] && ! msg=$$(DATABASE_URL="$$url" $(1) -m tests.backends); then \
	    if [ -n "$(IS_CI)" ]; then \
	      echo "sqlqueue: ERROR: $$msg -- CI=true requires every backend" >&2; \
	      summary="$$summary $$name=UNREACHABLE"; [ $$status -ne 0 ] || status=1; \
	    else \
	      echo "*** SKIPPED: $$msg ***"; \
	      summary="$$summary $$name=SKIPPED"; \
	    fi; \
	    continue; \
	  fi; \
	  rc=0; DATABASE_URL="$$url" $(1) -m pytest $(PYTEST_ARGS) || rc=$$?; \
	  if [ $$rc -eq 0 ]; then summary="$$summary $$name=ok"; \
	  else summary="$$summary $$name=FAILED(exit-$$rc)"; [ $$status -ne 0 ] || status=$$rc; fi; \
	done; \
	echo; \
	echo "sqlqueue: $(2) results:$$summary"; \
	exit $$status
endef

# --------------------------------------------------------------------------- targets

.PHONY: help demo demo-embedded admin test venvs test-matrix test-durations test-full test-backends test-compat test-wheel lint check-migrations bench bench-spark chaos chaos-short pgbouncer pgbouncer-stop provision clean FORCE
.PHONY: cluster-pg cluster-pg-stop cluster-galera cluster-galera-stop mariadb-second mariadb-second-stop
.PHONY: chaos-failover chaos-failover-short chaos-galera-spread test-chaos-runs test-chaos-after
.PHONY: docs docs-serve docs-check

help:
	@sed -n '3,/^$$/s/^# \{0,1\}//p' $(firstword $(MAKEFILE_LIST))

# The venv marker is re-checked on every run but only rewritten when the interpreter
# changes, so the install stamps below are redone only when needed.
$(VENV)/.sqlqueue-python: FORCE
	$(call ensure_venv,$(VENV),$(BASE_PYTHON),$(BASE_VERSION),$(DJANGO_SERIES))

$(COMPAT_VENV)/.sqlqueue-python: FORCE
	$(call ensure_venv,$(COMPAT_VENV),$(COMPAT_PYTHON),$(COMPAT_VERSION),$(COMPAT_DJANGO_SERIES))

# Package + Django + django-environ (the example project's settings read DATABASE_URL with
# it) only: no database drivers, no compiler.
$(VENV)/.stamp-base: pyproject.toml $(VENV)/.sqlqueue-python
	@echo "sqlqueue: installing django-sqlqueue (editable) into $(VENV)"
	$(PY) -m pip install -qq -e . 'Django~=$(DJANGO_SERIES).0' 'django-environ>=0.11'
	@touch $@

# Debian packages mysqlclient builds against, and running database servers (.ci/provision
# is idempotent and takes a fraction of a second when everything is in place).
provision:
	@if [ "$(PROVISION)" != 0 ]; then .ci/provision; fi

$(VENV)/.stamp-dev: pyproject.toml $(VENV)/.sqlqueue-python | provision
	@echo "sqlqueue: installing django-sqlqueue[dev,mysql,postgres] (editable) into $(VENV)"
	$(PY) -m pip install -qq -e '.[dev,mysql,postgres]' 'Django~=$(DJANGO_SERIES).0'
	@touch $@ $(VENV)/.stamp-base

# The spark extra (pyspark is a ~450 MB download, about a minute to install): its own
# stamp, so make demo never waits for it and make test installs it once.
# One pip run for every extra: a fresh clone resolves and downloads once.
$(VENV)/.stamp-spark: pyproject.toml $(VENV)/.sqlqueue-python | provision
	@echo "sqlqueue: installing django-sqlqueue[dev,mysql,postgres,spark] (editable) into $(VENV)"
	$(PY) -m pip install -qq -e '.[dev,mysql,postgres,spark]' 'Django~=$(DJANGO_SERIES).0'
	@touch $@ $(VENV)/.stamp-dev $(VENV)/.stamp-base

$(COMPAT_VENV)/.stamp-dev: pyproject.toml $(COMPAT_VENV)/.sqlqueue-python | provision
	@echo "sqlqueue: installing django-sqlqueue[dev,mysql,postgres] (editable) into $(COMPAT_VENV)"
	$(COMPAT_PY) -m pip install -qq -e '.[dev,mysql,postgres]' 'Django~=$(COMPAT_DJANGO_SERIES).0'
	@touch $@

# The benchmarks' extra packages (django-tasks-db, the tasks benchmark's comparison), in
# the bench environment only: the test runs never see them.
$(VENV)/.stamp-bench: pyproject.toml $(VENV)/.stamp-dev
	@echo "sqlqueue: installing django-sqlqueue[bench] into $(VENV)"
	$(PY) -m pip install -qq -e '.[dev,mysql,postgres,bench]' 'Django~=$(DJANGO_SERIES).0'
	@touch $@

# The documentation site's packages (the docs extra), in .venv beside the others: docs
# needs neither database drivers nor the spark extra.
$(VENV)/.stamp-docs: pyproject.toml $(VENV)/.sqlqueue-python
	@echo "sqlqueue: installing django-sqlqueue[docs] (editable) into $(VENV)"
	$(PY) -m pip install -qq -e '.[docs]' 'Django~=$(DJANGO_SERIES).0' 'django-environ>=0.11'
	@touch $@ $(VENV)/.stamp-base

demo: $(VENV)/.stamp-base
	$(PY) example_project/manage.py migrate --noinput
	$(PY) example_project/manage.py demo

# uvicorn besides the base install, for the embedded worker's demo only.
$(VENV)/.stamp-embedded: pyproject.toml $(VENV)/.stamp-base
	@echo "sqlqueue: installing uvicorn into $(VENV)"
	$(PY) -m pip install -qq 'uvicorn>=0.30'
	@touch $@

demo-embedded: $(VENV)/.stamp-embedded
	$(PY) example_project/manage.py migrate --noinput
	$(PY) example_project/manage.py demo_embedded

ADMIN_ADDRESS ?= 127.0.0.1:8000

admin: $(VENV)/.stamp-base
	$(PY) example_project/manage.py migrate --noinput
	$(PY) example_project/manage.py admin_demo
	$(PY) example_project/manage.py runserver $(ADMIN_ADDRESS)

lint: $(VENV)/.stamp-spark
	@echo "sqlqueue: [$$(date +%T)] $@"
	$(PY) -m ruff check $(LINT_PATHS)
	DATABASE_URL='$(SQLITE_URL)' $(PY) -m mypy django_sqlqueue

DOCS_ADDRESS ?= 127.0.0.1:8001
# Quiet the release notices that MkDocs' plugins print on every build.
DOCS_ENV := NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true
DOCS_CHECK_SITE := $(TEST_DATA)/docs-site

# mkdocs.yml: the pages of docs/, and the reference pages docs/gen_reference.py generates
# from the code at build time (settings, system checks, commands, metrics, the API).
docs: $(VENV)/.stamp-docs
	$(DOCS_ENV) $(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(VENV)/.stamp-docs
	$(DOCS_ENV) $(PY) -m mkdocs serve --strict --dev-addr $(DOCS_ADDRESS)

# The strict build (into .test-data, so make test leaves no site/ behind), then the
# samples of docs/tutorial and docs/how-to (docs/run_samples.py). Measured on this machine
# (2 CPUs), 2026-11-29, with the docs extra installed: 29 s quiet (the build 7 s, 26
# samples 20 s), 35 s beside other work (load average 2.3); installing the extra into a
# fresh .venv adds about 25 s once.
docs-check: $(VENV)/.stamp-docs
	@echo "sqlqueue: [$$(date +%T)] $@"
	$(DOCS_ENV) $(PY) -m mkdocs build --strict --quiet --site-dir $(DOCS_CHECK_SITE)
	$(PY) docs/run_samples.py --work $(TEST_DATA)/docs-samples

check-migrations: $(VENV)/.stamp-dev
	@echo "sqlqueue: [$$(date +%T)] $@"
	DATABASE_URL='$(SQLITE_URL)' DJANGO_SETTINGS_MODULE=tests.settings \
	  $(PY) -m django makemigrations --check --dry-run

# .venv has the spark extra: a Spark test that finds it missing fails instead of skipping.
test-backends: export SQLQUEUE_REQUIRE_SPARK := 1
test-backends: $(VENV)/.stamp-spark | provision
	$(call run_suite,$(PY),Python $(BASE_VERSION) / Django $(DJANGO_SERIES))

# make test under CI=true from a fresh clone on this machine (2 CPUs), 2026-11-28 at 9f73441:
# 847 s. Both virtualenvs 24 s, lint 8 s, migrations check 1 s, the 12 suites at once 723 s
# (the slowest, a half of Python 3.13 on PostgreSQL, 720 s; the short failover runs 287 s;
# the machine 89 % busy, so the matrix is bound by CPU, not by waits), the chaos run with its
# poison publisher about 100 s. The tests fork their workers from a launcher with Django
# loaded (tests/launcher.py). The suites run at once (tests/matrix.py), each backend's in
# TEST_SHARDS parts dealt by tests/durations.json; the short failover runs start in the
# tail, once at most three suites still run; the chaos run (it restarts MariaDB) comes
# last and alone. docs/benchmarks.md ("CI") has each suite's figures.
# The short failover runs (chaos-failover-short) in the matrix's tail: their clusters run
# on ports and in directories of their own, but beside twelve suites on two cores a worker
# could wait longer for the CPU than the resumption bound the run checks (seen: 17.2 s
# against 16.8 s), so they start only once at most three suites (niced) still run, where
# their timings mean something, rather than after the matrix.
FAILOVER_AFTER = $(if $(filter mysql,$(BACKENDS)),$(if $(filter postgres,$(BACKENDS)),chaos-failover-short))
FAILOVER_SUITE = '@3 Short failover runs on a PostgreSQL pair and a Galera cluster=!$(MAKE) --no-print-directory chaos-failover-short PROVISION=0'

test: venvs lint check-migrations test-matrix $(if $(filter mysql,$(BACKENDS)),test-chaos-after)

# The virtualenvs make test needs, built at once: their installs mostly wait on the network.
venvs: | provision
	@echo "sqlqueue: [$$(date +%T)] $@"
	@rc=0; \
	$(MAKE) --no-print-directory $(VENV)/.stamp-spark PROVISION=0 & base=$$!; \
	$(if $(IS_CI),$(MAKE) --no-print-directory $(COMPAT_VENV)/.stamp-dev PROVISION=0 & compat=$$!;) \
	wait $$base || rc=$$?; \
	$(if $(IS_CI),wait $$compat || rc=$$?;) \
	exit $$rc

# The wheel check runs beside the suites: it only uses SQLite files of its own.
WHEEL_SUITE = The wheel, installed=!$(NICED) $(PY) tests/wheel/check.py --work $(TEST_DATA)/wheel
# The documentation's strict build and samples (docs-check) beside the suites: it writes
# only under .test-data and uses SQLite files of its own.
DOCS_SUITE = The documentation: strict build and samples=!$(NICED) $(MAKE) --no-print-directory docs-check PROVISION=0


# Each backend's suite runs as TEST_SHARDS pytest processes at once (tests/shard.py deals
# the test files out), each against a database of its own: the suites mostly wait on
# workers and leases, and one process per backend left the machine a third idle while the
# slowest suite set the pace. Part 1 uses the backend's URL; part k, database test<k> (or
# the SQLite file sqlqueue-<k>.sqlite3), which .ci/provision creates.
TEST_SHARDS ?= 2
SHARD_NUMBERS = $(shell seq 1 $(TEST_SHARDS))
shard_files = $(if $(filter-out 1,$(TEST_SHARDS)),$(shell $(BASE_PYTHON) tests/shard.py $(TEST_SHARDS) $(2) $(1)))
shard_url = $(if $(filter 1,$(2)),$(call backend_url,$(1)),$(if $(filter sqlite,$(1)),sqlite:///$(TEST_DATA)/sqlqueue-$(2).sqlite3,$(call backend_url,$(1))$(2)))

# $(call suite,<title>,<python>,<url>,<pytest args>): one argument of tests/matrix.py.
suite = '$(1)=$(2)|$(3)|$(4)'
backend_url = $(if $(filter sqlite,$(1)),$(SQLITE_URL),$(if $(filter mysql,$(1)),$(MYSQL_URL),$(POSTGRES_URL)))
backend_slug = $(if $(filter sqlite,$(1)),sqlite,$(if $(filter mysql,$(1)),mariadb,postgresql))
backend_name = $(if $(filter sqlite,$(1)),SQLite,$(if $(filter mysql,$(1)),MariaDB,PostgreSQL))
compat_url = $(if $(filter sqlite,$(1)),$(COMPAT_SQLITE_URL),$(if $(filter mysql,$(1)),$(COMPAT_MYSQL_URL),$(COMPAT_POSTGRES_URL)))
# Under CI=true the Python 3.11 run goes along: in full on SQLite, and on the servers the
# migrations, checks and publishing. The spark extra is not installed there.
COMPAT_SUITES = $(if $(IS_CI),$(foreach b,$(BACKENDS),$(call suite,Python $(COMPAT_VERSION) / Django $(COMPAT_DJANGO_SERIES): $(call backend_name,$(b)),$(NICED) env SQLQUEUE_REQUIRE_SPARK=0 $(COMPAT_PY),$(call compat_url,$(b)),$(if $(filter sqlite,$(b)),$(COMPAT_SQLITE_SELECTION),$(COMPAT_SMOKE_TESTS)) $(PYTEST_ARGS))))

# The Spark session's tests against one backend, in a database of their own: MariaDB
# when it is in BACKENDS, else PostgreSQL, else SQLite.
SPARK_BACKEND = $(firstword $(filter mysql,$(BACKENDS)) $(filter postgres,$(BACKENDS)) sqlite)
SPARK_SUITE_URL = $(if $(filter mysql,$(SPARK_BACKEND)),$(SPARK_URL),$(if $(filter postgres,$(SPARK_BACKEND)),postgres://postgres@127.0.0.1:5432/spark,sqlite:///$(TEST_DATA)/spark.sqlite3))
SPARK_SUITE = $(call suite,Python $(BASE_VERSION): Spark sessions on $(call backend_name,$(SPARK_BACKEND)),$(PY),$(SPARK_SUITE_URL),-m spark --durations=10 $(PYTEST_ARGS))

# Every suite but the Spark sessions runs niced: under load, Spark's Python workers must
# still start within Spark's fixed 10 s or the query fails ("Python worker failed to connect
# back"). The database servers are not niced, so the suites' shares among themselves stay.
NICED = nice -n 5

test-matrix: export SQLQUEUE_REQUIRE_SPARK := 1
test-matrix: $(VENV)/.stamp-spark $(VENV)/.stamp-docs $(if $(IS_CI),$(COMPAT_VENV)/.stamp-dev) | provision
	@echo "sqlqueue: [$$(date +%T)] $@"
	@mkdir -p $(TEST_DATA)
	$(PY) -m tests.matrix \
	  $(foreach b,$(BACKENDS),$(foreach k,$(SHARD_NUMBERS),$(call suite,Python $(BASE_VERSION) / Django $(DJANGO_SERIES): $(call backend_name,$(b))$(if $(filter-out 1,$(TEST_SHARDS)), (part $(k) of $(TEST_SHARDS))),$(NICED) $(PY),$(call shard_url,$(b),$(k)),-m "not spark" --durations=15 $(call shard_files,$(b),$(k)) $(PYTEST_ARGS)))) \
	  $(SPARK_SUITE) \
	  $(COMPAT_SUITES) \
	  '$(DOCS_SUITE)' \
	  '$(WHEEL_SUITE)' \
	  $(if $(FAILOVER_AFTER),$(FAILOVER_SUITE))

# The last make test's time per test file, kept for tests/shard.py: each backend's parts
# (tests/matrix.py has every suite write its files' times next to its log).
test-durations:
	@$(foreach b,$(BACKENDS),$(BASE_PYTHON) tests/file_times.py record $(b) \
	  $(foreach k,$(SHARD_NUMBERS),$(TEST_DATA)/logs/python-$(subst .,-,$(BASE_VERSION))---django-$(subst .,-,$(DJANGO_SERIES))--$(call backend_slug,$(b))$(if $(filter-out 1,$(TEST_SHARDS)),--part-$(k)-of-$(TEST_SHARDS)).times.json) &&) true

# The whole matrix, one run after another, as a release wants it.
test-full: lint check-migrations test-wheel test-backends $(if $(filter mysql,$(BACKENDS)),chaos-short) test-compat

# Without the spark extra: the Spark tests are skipped there, each with its reason.
test-compat: $(COMPAT_VENV)/.stamp-dev | provision
	DATABASE_URL='$(SQLITE_URL)' DJANGO_SETTINGS_MODULE=tests.settings \
	  $(COMPAT_PY) -m django makemigrations --check --dry-run
	$(call run_suite,$(COMPAT_PY),Python $(COMPAT_VERSION) / Django $(COMPAT_DJANGO_SERIES))

# What a user installing from an index gets: tests/wheel/check.py builds in .test-data/wheel
# from a copy of the files a clone would have, so the checkout's egg-info never leaks in.
test-wheel: $(VENV)/.stamp-dev
	$(PY) tests/wheel/check.py --work $(TEST_DATA)/wheel

bench: $(VENV)/.stamp-bench | provision
	DATABASE_URL='$(BENCH_DATABASE_URL)' PYTHONPATH='$(ROOT)' $(PY) benchmarks/run.py $(BENCH_ARGS)

bench-spark: $(VENV)/.stamp-spark | provision
	DATABASE_URL='$(BENCH_DATABASE_URL)' PYTHONPATH='$(ROOT)' $(PY) benchmarks/spark_bench.py $(BENCH_ARGS)

# The chaos run restarts the database server once (when it runs on this machine): see
# docs/reliability.md.
chaos: $(VENV)/.stamp-dev | provision
	DATABASE_URL='$(CHAOS_DATABASE_URL)' $(PY) -m tests.chaos.run --seconds $(CHAOS_SECONDS) $(CHAOS_ARGS)

# After the suites: the 60 s chaos run on MariaDB, alone. It restarts the shared server;
# started beside the last suites and the failover runs, the server once crashed in its
# shutdown (signal 11 in ha_maria::drop_table, MariaDB 10.11.19) and never came back.
test-chaos-after: $(VENV)/.stamp-dev | provision
	@echo "sqlqueue: [$$(date +%T)] $@"
	$(PY) -m tests.matrix 'The 60 s chaos run on MariaDB=!$(MAKE) --no-print-directory chaos-short PROVISION=0'

# The 60 s chaos run on MariaDB and the short failover runs side by side, alone (make test
# runs the failover runs in the matrix's tail, the chaos run after it); each prints its
# output whole when it ends.
test-chaos-runs: $(VENV)/.stamp-dev | provision
	@echo "sqlqueue: [$$(date +%T)] $@"
	$(PY) -m tests.matrix 'The 60 s chaos run on MariaDB=!$(MAKE) --no-print-directory chaos-short PROVISION=0' \
	  $(if $(FAILOVER_AFTER),'Short failover runs on a PostgreSQL pair and a Galera cluster=!$(MAKE) --no-print-directory chaos-failover-short PROVISION=0')

chaos-short: $(VENV)/.stamp-dev | provision
	@echo "sqlqueue: [$$(date +%T)] $@"
	DATABASE_URL='$(MYSQL_URL)' $(PY) -m tests.chaos.run --seconds $(CHAOS_SHORT_SECONDS) \
	  --drain-timeout 180 $(CHAOS_ARGS)

# PgBouncer in transaction pooling mode in front of the local PostgreSQL, on port 26432
# (SQLQUEUE_PGBOUNCER_PORT), its files under .test-data/pgbouncer: prints the URL to use.
pgbouncer: | provision
	@$(PY) -m clusters.pgbouncer start

pgbouncer-stop:
	@$(PY) -m clusters.pgbouncer stop

# $(call failover_runs,<seconds>,<extra arguments>): the chaos run on a fresh PostgreSQL
# pair whose primary fails over, then on a fresh Galera cluster whose writer node is
# killed (tests/chaos/failover.py); both run, and the first failure's status is returned.
define failover_runs
	@rc=0; for kind in pg galera; do \
	  echo "sqlqueue: [$$(date +%T)] $@: $$kind"; \
	  $(PY) -m tests.chaos.run --failover $$kind --seconds $(1) $(2) $(CHAOS_ARGS) \
	    || { code=$$?; [ $$rc -ne 0 ] || rc=$$code; }; \
	done; \
	exit $$rc
endef

# Each starts its cluster fresh on ports of its own (clusters/) and stops it at the end,
# so it may run beside the test servers, but alone: it takes both cores. Measured on this
# machine: 30 s each, both together about 125 s (cluster starts 2 s and 12 s, drains
# 15-30 s). docs/reliability.md ("Failover") has the full runs.
chaos-failover: $(VENV)/.stamp-dev | provision
	$(call failover_runs,$(CHAOS_FAILOVER_SECONDS))

chaos-failover-short: $(VENV)/.stamp-dev | provision
	$(call failover_runs,$(CHAOS_FAILOVER_SHORT_SECONDS),--drain-timeout 180)

chaos-galera-spread: $(VENV)/.stamp-dev | provision
	$(PY) -m tests.chaos.run --galera-spread --seconds $(CHAOS_FAILOVER_SECONDS) $(CHAOS_ARGS)

# The local clusters (clusters/, standard library only): each starts from Debian's
# packages on ports and data directories of its own (.test-data/clusters), or is kept when
# it runs already, and prints its URLs; docs/operating.md has the settings for each.
# `python -m clusters pg run -- COMMAND` runs a command with a fresh cluster up.
cluster-pg: | provision
	@$(BASE_PYTHON) -m clusters pg

cluster-pg-stop:
	@$(BASE_PYTHON) -m clusters pg --stop

cluster-galera: | provision
	@$(BASE_PYTHON) -m clusters galera

cluster-galera-stop:
	@$(BASE_PYTHON) -m clusters galera --stop

mariadb-second: | provision
	@$(BASE_PYTHON) -m clusters mariadb

mariadb-second-stop:
	@$(BASE_PYTHON) -m clusters mariadb --stop

clean:
	rm -rf $(VENV) $(COMPAT_VENV) .test-data .mypy_cache .ruff_cache .pytest_cache build dist site
	rm -rf *.egg-info example_project/*.sqlite3 example_project/*.sqlite3-* example_project/demo-logs
	find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

FORCE:
