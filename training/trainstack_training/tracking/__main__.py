"""`python -m trainstack_training.tracking watch|sync ...`: the tracking daemon and the `sync`
command on the tracking node (cli.py; roles/mlflow's `mlflow_sync_module`,
infra.jobs.remote.sync_tracking)."""

import sys

from trainstack_training.tracking.cli import main

if __name__ == "__main__":
    sys.exit(main())
