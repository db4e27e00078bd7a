#!/usr/bin/env bash
# Every linter the project keeps clean, in one place (make lint, and the fast tier beside the
# unit tests). Expects scripts/env.sh's environment (make sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
ruff check .
ruff format --check .
mypy infra training trainstack
yamllint -s .
ansible-lint
python -m infra.monitoring check
