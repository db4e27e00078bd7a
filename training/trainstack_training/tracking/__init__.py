"""Every job an MLflow run, made from its run directory's files (docs/jobs.md, "Tracking").

    python -m trainstack_training.tracking watch --models-dir DIR --tracking-uri URL
        [--auth-file INI] [--ui-url URL] [--stack NAME] [--interval S]
    python -m trainstack_training.tracking sync [--job JOB_DIR_OR_ID] (same options)

The job never talks to MLflow: its chief's records in the run directory are the source
(the queue process's ``job.json``, ``epochs.jsonl``, ``output.log``; the report's ``metrics.json``,
``curves.png`` and the model file; trainstack_training.rundir names them), and `sync_run`
turns them into the run, as often as it is called: the run is found by its tags
``trainstack.job_id`` and ``trainstack.launch`` (a declared job launched again in its
directory is a new run), a param already logged is not logged again, an epoch's metrics are
logged only at steps the run does not have yet, an artifact already listed (same size) is not
uploaded again. The tracking server down loses nothing: the next sync completes the run. After
a sync, ``<run dir>/tracking.json`` says where the run is (`trainstack status` reads it;
nothing there talks to MLflow), and a complete run whose files have not changed since is
skipped without a request.

A sweep (trainstack_training.sweep) is one more run, its trials' runs its children: the
parent is made once, from the sweep's directory (`<models dir>/sweeps/<id>`: its params,
its best value as it improves, ended with the sweep), and its id kept in that directory's
tracking.json (`trainstack sweep status` reads it).

The modules, one process each:
    runfiles.py  reading a run directory (RunFiles, tracking.json, which directories are
                 runs): the sync's; `trainstack status` on the control machine reads
                 tracking.json with TRACKING_FILE and run_url
    sync.py      one run (sync_run) and many (sync_all) to MLflow: the sync on the tracking
                 node (the daemon's rounds, the `sync` command)
    sweeps.py    a sweep's parent run (sync_sweep, sync_sweeps) and a trial's tags naming it
                 (child_tags): sync.py's sync of a trial, the daemon's rounds, `sync`
    daemon.py    `watch`, the tracking daemon (supervisor, on the tracking node): every
                 `interval` it syncs each run directory that is not complete, then each
                 sweep whose parent run has not ended
    cli.py       the command line (`__main__.py` runs it), in the mlflow role's venv on the
                 tracking node

`mlflow` is imported inside the functions: the training venv on the nodes has no MLflow, and
the training package (this package included) imports without it.
"""

from trainstack_training.rundir import TRACKING_FILE, TRACKING_LOCK
from trainstack_training.tracking.cli import UsageError, main, make_client, read_auth_file
from trainstack_training.tracking.daemon import watch
from trainstack_training.tracking.runfiles import (
    ARTIFACTS,
    TAG_PREFIX,
    RunFiles,
    SweepFiles,
    files_signature,
    is_run_dir,
    read_epochs,
    read_tracking,
    run_dirs,
    run_url,
    sweep_dirs,
    up_to_date,
    write_tracking,
)
from trainstack_training.tracking.sweeps import PARENT_TAG, sync_sweep, sync_sweeps
from trainstack_training.tracking.sync import (
    ERROR_TAG,
    JOB_ID_TAG,
    LAUNCH_TAG,
    Synced,
    TrackingError,
    run_lock,
    sync_all,
    sync_run,
)

__all__ = [
    "ARTIFACTS",
    "ERROR_TAG",
    "JOB_ID_TAG",
    "LAUNCH_TAG",
    "PARENT_TAG",
    "TAG_PREFIX",
    "TRACKING_FILE",
    "TRACKING_LOCK",
    "RunFiles",
    "SweepFiles",
    "Synced",
    "TrackingError",
    "UsageError",
    "files_signature",
    "is_run_dir",
    "main",
    "make_client",
    "read_auth_file",
    "read_epochs",
    "read_tracking",
    "run_dirs",
    "run_lock",
    "run_url",
    "sweep_dirs",
    "sync_all",
    "sync_run",
    "sync_sweep",
    "sync_sweeps",
    "up_to_date",
    "watch",
    "write_tracking",
]
