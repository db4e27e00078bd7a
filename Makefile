# trainstack: every target sets up what is missing first (scripts/setup.sh is
# idempotent and takes seconds once everything is there).
SHELL := /bin/bash
STACK ?= dev
PYTEST_ARGS ?=
export PYTEST_ARGS
ENV := eval "$$(scripts/env.sh)"
SETUP := scripts/setup.sh

.PHONY: help setup env up preview outputs destroy test test-fast test-engine unit drills test-ssh lint format bench lock clean-tools images clean-images clean-test-stacks

help: ## List the targets.
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

setup: ## Install everything missing: Docker engine, base image, Pulumi CLI, venv, Java.
	@$(SETUP)

env: ## Print shell exports: eval "$$(make -s env)", then plain `pulumi ...`.
	@scripts/env.sh

up: setup ## Bring up the local stack $(STACK) (pulumi up) and show its outputs.
	@$(ENV); pulumi stack select --create $(STACK) --non-interactive && pulumi up --yes --stack $(STACK)

preview: setup ## Show what `make up` would change.
	@$(ENV); pulumi stack select --create $(STACK) --non-interactive && pulumi preview --stack $(STACK)

outputs: ## Show the stack's outputs.
	@$(ENV); pulumi stack output --stack $(STACK)

destroy: setup ## Remove the local stack $(STACK) from the engine.
	@$(ENV); pulumi destroy --yes --stack $(STACK)

images: setup ## Bake the node image trainstack-node:<digest> (no stack needed; FORCE=1 rebakes).
	@$(ENV); python -m infra.images bake $(if $(FORCE),--force)

clean-images: setup ## Remove node images of other digests than the current one.
	@$(ENV); python -m infra.images clean

clean-test-stacks: setup ## Remove what killed test runs left on the engine (test labels only; never the dev stack).
	@$(ENV); python -m tests.support.leftovers

test-fast: setup ## The edit loop: lint beside the unit tests (no engine), about 1.5-2 minutes.
	@$(ENV); python scripts/testplan.py fast

test: setup ## Everything, fast tier first (a failure stops there), then the engine tier; a time table at the end.
	@$(ENV); export TRAINSTACK_TIMES_DIR=$$(mktemp -d); \
	  python scripts/testplan.py fast && python scripts/testplan.py engine; rc=$$?; \
	  python scripts/testplan.py table; exit $$rc

test-engine: setup ## Every test but the unit tests: four streams, each started when what it needs has passed (scripts/testplan.py).
	@$(SETUP) browser
	@$(ENV); python scripts/testplan.py engine

unit: setup ## The unit tests only (no engine, no lint).
	@$(ENV); pytest -m unit $(PYTEST_ARGS)

drills: setup ## The failure drills on a real stack (recovery times into bench/results/drills.json).
	@$(ENV); pytest -m drills tests/platform $(PYTEST_ARGS)

test-ssh: setup ## The ssh target end to end on sshd containers (Debian 12 + openssh-server).
	@$(ENV); pytest -m ssh tests/ssh $(PYTEST_ARGS)

lint: setup ## ruff, ruff format --check, mypy, yamllint, ansible-lint, promtool check (scripts/lint.sh).
	@$(ENV); scripts/lint.sh

format: setup ## Apply ruff's fixes and formatting.
	@$(ENV); ruff check --fix .; ruff format .

bench: setup ## Run every benchmark under bench/ (JSON into bench/results/).
	@$(ENV); mkdir -p bench/results; set -e; for b in bench/bench_*.py; do \
	  n=$$(basename $$b .py); echo "== $$n"; python $$b --out bench/results/$$n.json; done

lock: setup ## Re-pin constraints.txt from the current virtual environment.
	@$(ENV); { echo "# Pinned versions for the control machine and the nodes (pip constraints)."; \
	  echo "# Regenerate with: make lock"; pip freeze --exclude-editable | grep -v '^trainstack'; } > constraints.txt

clean-tools: ## Undo setup's project-local parts: tools/, .venv/, .setup/ (keeps stack state).
	rm -rf tools .venv .setup
