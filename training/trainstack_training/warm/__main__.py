"""`python -m trainstack_training.warm --state DIR --keep-alive SECONDS --key KEY`: the warm
runner's own process (server.py), started by a job's driver (client.py)."""

from __future__ import annotations

import sys

from trainstack_training.warm.server import main

if __name__ == "__main__":
    sys.exit(main())
