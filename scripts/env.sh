#!/usr/bin/env bash
# Prints the shell exports that put trainstack's toolchain in front:
#   eval "$(make -s env)"    then plain `pulumi up`, `pulumi stack output`, ...
# Values already set in the caller's environment win (use an installed Pulumi CLI
# by putting it on PATH and exporting TRAINSTACK_USE_SYSTEM_PULUMI=1).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
q() { printf "%q" "$1"; }
path="$ROOT/tools/bin:$ROOT/.venv/bin"
echo "export PATH=$(q "$path"):\"\$PATH\""
echo "export VIRTUAL_ENV=$(q "$ROOT/.venv")"
echo "export PULUMI_HOME=$(q "${PULUMI_HOME:-$ROOT/tools/pulumi-home}")"
echo "export PULUMI_BACKEND_URL=$(q "${PULUMI_BACKEND_URL:-file://$ROOT/.pulumi-state}")"
if [ -z "${PULUMI_CONFIG_PASSPHRASE:-}" ]; then
  echo "export PULUMI_CONFIG_PASSPHRASE_FILE=$(q "${PULUMI_CONFIG_PASSPHRASE_FILE:-$ROOT/.pulumi-state/passphrase}")"
fi
echo "export PULUMI_SKIP_UPDATE_CHECK=true"
# The venv holds pulumi-aws for the AWS target (tested under mocks only). Pulumi would try
# to download its plugin on every command (no registry reachable here: 5 attempts, 2.5 s
# each `up`); plugins come from `make setup` or `pulumi plugin install` (docs/targets.md).
echo "export PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=${PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION:-true}"
# The Python the official language host runs the program with. Pulumi.yaml names no
# `virtualenv` (see the comment there), so the host takes PULUMI_PYTHON_CMD (else the
# python3 on PATH); the dynamic-provider host (pulumi-resource-pulumi-python) takes
# PULUMI_RUNTIME_VIRTUALENV. Both point at the project's .venv, also for other
# projects run from this shell (the tests' smoke projects).
echo "export PULUMI_PYTHON_CMD=$(q "$ROOT/.venv/bin/python")"
echo "export PULUMI_RUNTIME_VIRTUALENV=$(q "$ROOT/.venv")"
echo "export JAVA_HOME=$(q "${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v java 2>/dev/null || echo /usr/bin/java)")")")}")"
