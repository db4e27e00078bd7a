"""`python -m infra.targets.ssh facts|teardown`: the command line each server's
`command.local.Command` runs (infra.targets.ssh.cli)."""

import sys

from infra.targets.ssh.cli import main

if __name__ == "__main__":
    sys.exit(main())
