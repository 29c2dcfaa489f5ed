# icesink developer entry points. Everything runs against real local servers (dev/stack).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTEST_ARGS ?=
# Tests run in parallel on this many pytest-xdist workers, the heaviest first (tests/scheduling.py
# refines `--dist loadfile`: a file whose tests share a module fixture stays on one worker, other
# tests go one by one, ordered by tests/durations.json). On 2 cores, 3 workers in that order took
# 31:04 against 33:14 for 2 in loadfile's, for 17% more CPU (46 against 39 CPU-minutes): not worth
# it on a busier machine. PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2
BENCH_ARGS ?= --size small

.PHONY: help bootstrap stack-up stack-down stack-status test chaos lint demo chart-check bench

help:
	@echo "make demo        install what is missing, start the local stack, run the sink demo"
	@echo "make test        install what is missing, start the local stack, run the test suite"
	@echo "make chaos       the fault-injection suite (kills, zombies, outages, maintenance races, cluster kills; ~40 min; restarts servers)"
	@echo "make bench       icesink vs MERGE INTO / writeStream / the ceiling (BENCH_ARGS=\"--size medium\")"
	@echo "make lint        ruff + mypy"
	@echo "make bootstrap   apt packages, .venv, dev stack downloads (idempotent)"
	@echo "make stack-up / stack-down / stack-status"

bootstrap:
	scripts/bootstrap

stack-up:
	dev/stack up

stack-down:
	dev/stack down

stack-status:
	dev/stack status

test: bootstrap
	dev/stack up
	.venv/bin/pytest -m "not chaos and not bench and not slow" -n $(PYTEST_WORKERS) --dist loadfile --durations=40 $(PYTEST_ARGS) \
		|| { rc=$$?; dev/stack logs -n 40; exit $$rc; }

chaos: bootstrap
	dev/stack up
	.venv/bin/pytest -m "chaos or slow" tests/chaos tests/txnlog tests/sink/test_restarts.py tests/sink/test_maintenance.py \
		tests/sink/test_debezium.py tests/sink/test_avro.py tests/sink/test_protobuf.py $(PYTEST_ARGS)

bench: bootstrap
	dev/stack up
	.venv/bin/python -m bench $(BENCH_ARGS)

chart-check:
	scripts/check-chart

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	.venv/bin/mypy --strict dev/stack.py dev/cpu_by_process.py
	.venv/bin/mypy --explicit-package-bases tests/conftest.py readers/__init__.py tests/cdc.py tests/avro.py tests/smoke
	.venv/bin/mypy --explicit-package-bases tests/ops
	.venv/bin/mypy --explicit-package-bases bench tests/google_oauth.py tests/http_stub.py tests/sink
	shellcheck scripts/check-chart scripts/k8s-chaos.sh deploy/docker/*.sh

demo: bootstrap
	dev/stack up
	@if [[ -x scripts/demo ]]; then scripts/demo; \
	else echo; echo "The local stack is up (dev/stack status). The CDC sink demo arrives with the sink itself;"; \
	     echo "until then, try: eval \"\$$(dev/stack env)\" && .venv/bin/pytest tests/smoke"; fi
