"""The tracking daemon's loop (`watch`): every `interval`, sync each run directory of the
models directory that is not complete, then pass over the sweeps' directories
(`<models dir>/sweeps/<id>`, never taken for runs: rundir.NOT_RUNS): each sweep's MLflow
parent run made if missing, its best value, its end (sweeps.py).

Runs in the tracking daemon, the supervisor program `trainstack-tracking-sync` on the tracking
node (roles/mlflow: `python -m trainstack_training.tracking watch`, in the role's venv, as the
daemons' user); cli.py starts it.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from trainstack_training.tracking.runfiles import run_dirs
from trainstack_training.tracking.sweeps import sync_sweeps
from trainstack_training.tracking.sync import Synced, one_line, sync_all

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient


def watch(
    models_dir: Path, client: MlflowClient, interval: float = 2.0, *, stack: str = "",
    ui_url: str = "", stop: threading.Event | None = None,
) -> None:  # fmt: skip
    """The daemon's loop: every `interval`, sync every run directory that is not complete,
    then every sweep whose parent run has not ended (after the runs: a trial's last sync comes
    before its sweep's end).
    An error is one line on stderr (once until it changes) and is retried next round; `stop`
    (SIGTERM, when run as the daemon) ends the loop."""
    stop = stop or threading.Event()
    said: dict[str, str] = {}
    while not stop.is_set():
        try:
            synced = sync_all(run_dirs(models_dir), client, stack=stack, ui_url=ui_url)
            synced += sync_sweeps(models_dir, client, stack=stack, ui_url=ui_url)
        except Exception as exc:  # the daemon must outlive anything one round meets
            synced = [Synced(str(models_dir), error=one_line(exc))]
        for s in synced:
            if s.error and said.get(s.job_id) != s.error:
                print(f"tracking: {s.job_id}: not synced ({s.error}); retrying", file=sys.stderr)
            elif not s.error and not s.skipped and s.job_id in said:
                print(f"tracking: {s.job_id}: synced", file=sys.stderr)
            said[s.job_id] = s.error
        stop.wait(interval)
