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

The modules, one process each:
    runfiles.py  reading a run directory (RunFiles, tracking.json, which directories are
                 runs): the sync's; `trainstack status` on the control machine reads
                 tracking.json with TRACKING_FILE and run_url
    sync.py      one run (sync_run) and many (sync_all) to MLflow: the sync on the tracking
                 node (the daemon's rounds, the `sync` command)
    daemon.py    `watch`, the tracking daemon (supervisor, on the tracking node): every
                 `interval` it syncs each run directory that is not complete
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
    files_signature,
    is_run_dir,
    read_epochs,
    read_tracking,
    run_dirs,
    run_url,
    up_to_date,
    write_tracking,
)
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
    "TAG_PREFIX",
    "TRACKING_FILE",
    "TRACKING_LOCK",
    "RunFiles",
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
    "sync_all",
    "sync_run",
    "up_to_date",
    "watch",
    "write_tracking",
]
