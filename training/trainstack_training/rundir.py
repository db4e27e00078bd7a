"""The run directory: every file a run's processes hand each other, and the one way to read and
write its JSON. The run-directory twin of infra/nodes.py: a file's name changes here and
nowhere else.

A run directory is `<models dir>/<run id>` on the cluster's shared storage: `job-...` for a job
from `trainstack submit`, `run-...` for the stack's declared job. Several processes on several
nodes write into it, and others read it while they do, so every JSON file is written whole or
not at all (`write_json`: a temporary file renamed over it) and read as {} when it is not
there yet (`read_json`). Who writes each file and who reads it:

    job.json          the job's record: id, state, settings, result (the queue process;
                      `trainstack submit` writes its first version) -> status, list, the
                      queue's order, the tracking sync
    output.log        the job's output, one line per finished epoch among it (the queue
                      process) -> `trainstack logs`, the tracking sync (an artifact)
    install.sh        the job's packages' install (`trainstack submit`) -> the queue process
    waiting.json      why the job's Spark application waits for cores (the driver) -> the
                      queue process (`queued`, with waiting_for)
    launch.json       when this launch of the run started (the driver) -> the tracking sync
    failed.json       how a launch that did not succeed ended (the driver) -> the sync
    attempts.log      one line per barrier-stage attempt (a rank) -> the driver's report
    .job-error.json   the first user error of the run (a rank) -> retried ranks, the driver
    epochs.jsonl      one JSON row per finished epoch (the chief rank) -> the queue process,
                      the report, the tracking sync
    rank-N.log        each rank's own output (the rank) -> `trainstack logs --rank N`
    rank-N.memory.jsonl  each rank's peak memory and OOM kills (memwatch) -> the driver
    .stop.json        why the job is being stopped (a sweep's driver) -> the queue process
    stacks-rankN.txt  a stalled rank's Python stacks (the watchdog) -> the user
    metrics.json      the result: metrics, time split, config (the driver's report) -> the
                      declared job's result, status, the tracking sync
    curves.png        the training curves (the report) -> the result, the sync
    model.keras, model.pt, model.pt2   the model (the chief rank; model.pt2: torch.export's
                      program, when the model traces) -> the result, the sync
    backup/           the checkpoint a lost rank resumes from (the ranks)
    data/             the staged shards (the driver's data stage) -> the ranks
    utilisation.png   the run's CPU picture from Prometheus (the declared job's provider)
    tracking.json     the run's MLflow run (the tracking sync) -> status
    .tracking.lock    held while the run is synced

Imports nothing of the package: every process may read it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path
from typing import Any

# The job's record and its output (the queue process).
RECORD = "job.json"
OUTPUT = "output.log"
INSTALL_SCRIPT = "install.sh"
# The driver's.
WAITING_FILE = "waiting.json"
LAUNCH_FILE = "launch.json"
FAILED_FILE = "failed.json"
METRICS_FILE = "metrics.json"
PLOT_FILE = "curves.png"
DATA_DIR = "data"
# The ranks'.
ATTEMPTS_LOG = "attempts.log"
ERROR_FILE = ".job-error.json"
EPOCH_LOG = "epochs.jsonl"
RANK_LOG = "rank-{rank}.log"
MEMORY_FILE = "rank-{rank}.memory.jsonl"
MEMORY_GLOB = "rank-*.memory.jsonl"
STACKS_FILE = "stacks-rank{rank}.txt"
BACKUP_DIR = "backup"
TORCH_CHECKPOINT = "torch-checkpoint.pt"  # in BACKUP_DIR: model, optimizer and epoch
# TEST ONLY: a rank killed by a fault hook leaves this, so the resumed run is not killed again.
FAULT_MARKER = ".fault-injected"
# The model each framework saves, and torch.export's program beside torch's model.
MODEL_FILES = {"tensorflow": "model.keras", "torch": "model.pt"}
EXPORTED_FILE = "model.pt2"
# The run's utilisation picture (infra.monitoring), beside curves.png.
UTILISATION_PLOT = "utilisation.png"
# The tracking sync's.
TRACKING_FILE = "tracking.json"
TRACKING_LOCK = ".tracking.lock"

# The files a run may leave as its result, in the order they are shown: the model (each
# framework's, torch's exported program), the curves, the metrics. The tracking sync uploads
# them with the output; the declared job's provider copies them to the host.
RESULT_FILES = (*MODEL_FILES.values(), EXPORTED_FILE, PLOT_FILE, METRICS_FILE)
# The files left by an earlier launch of the run that a fresh launch drops.
LAUNCH_LEFTOVERS = (ATTEMPTS_LOG, FAILED_FILE, FAULT_MARKER, ERROR_FILE, WAITING_FILE)

# A job's states, in the order it goes through them (docs/jobs.md). `pruned`: a sweep's trial
# stopped by its sweep for lagging (STOP_FILE said so before the cancel).
FINAL_STATES = ("succeeded", "failed", "cancelled", "pruned")
STATES = ("installing", "queued", "running", *FINAL_STATES)
# Why a job is being stopped, {"reason": "pruned"}: written by a sweep's driver before it sends
# the queue process SIGTERM (a file of its own: the queue process alone merges job.json).
# Without it a stopped job ends `cancelled`.
STOP_FILE = ".stop.json"

# The runs directory (the models directory, which holds every run directory): what is in it
# beside the runs.
QUEUE_LOCK = ".barrier.lock"  # one admission decision at a time (the queue process, flock)
WARM_RUNNER_FILE = ".warm-runner.json"  # which node's warm runner holds the cores
WARM_RUNNER_STOP = ".warm-runner.stop"  # a job on another node asks it to yield
WARM_RUNNER_YIELDS = ".warm-runner.yields.json"  # the cluster's yields so far
JOBS_DIR = "jobs"  # the jobs' code, by content sha
ENVS_DIR = "envs"  # the jobs' package overlays
SWEEPS_DIR = "sweeps"  # one directory per sweep (below)
NOT_RUNS = frozenset({JOBS_DIR, ENVS_DIR, SWEEPS_DIR})

# A sweep's directory, `<models dir>/sweeps/<sweep id>` (trainstack_training.sweep): its trials
# are jobs with run directories of their own (`<sweep id>-t<N>`, each record naming its sweep
# and trial number).
#
#     sweep.json     the sweep's record: id, definition, the trials' job template, state,
#                    the driver's pid, node and heartbeat (`trainstack sweep` writes its first
#                    version; the driver keeps it) -> sweep status/list/cancel/resume
#     study.journal  the Optuna study (its JournalStorage, file backend): every trial asked,
#                    its reports and its end (the driver) -> a resumed driver
#     trials.json    the trials' table and the best trial (the driver) -> sweep status, the
#                    tracking sync (the parent run's best value, the best trial's tag)
#     output.log     the driver's output -> `trainstack sweep logs`
#     tracking.json  the sweep's MLflow parent run (the tracking sync) -> sweep status
SWEEP_RECORD = "sweep.json"
STUDY_JOURNAL = "study.journal"
TRIALS_FILE = "trials.json"
SWEEP_STATES = ("running", "succeeded", "failed", "cancelled")
# A trial job's record fields: its sweep's id and its number in the study.
SWEEP_FIELD, TRIAL_FIELD = "sweep", "trial"


def model_file(framework: str) -> str:
    """The model file of a run of `framework`."""
    return MODEL_FILES[framework]


def rank_log(rank: int) -> str:
    return RANK_LOG.format(rank=rank)


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object file; {} when it is not there, not whole, or not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return dict(value) if isinstance(value, dict) else {}


def write_json(
    path: Path,
    value: dict[str, Any],
    *,
    mode: int | None = None,
    first: bool = False,
    indent: int | None = None,
    sort_keys: bool = True,
) -> bool:
    """Write `path` whole or not at all: readers on any node see the old file or the new one,
    never half of one. `mode`: the file's permission bits (from its creation on); `first`:
    only when `path` is not there yet (the first writer wins; False when another was first);
    `indent`, `sort_keys`: as json.dumps's (a file people read keeps its keys' order).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    # Created with `mode` (no window where the file is wider), else as open() would.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(value, sort_keys=sort_keys, indent=indent) + "\n")
        if mode is not None:
            os.chmod(tmp, mode)  # the umask may have narrowed it
        if first:
            try:
                os.link(tmp, path)  # fails when the file is there: atomic first-wins
            except FileExistsError:
                return False
            return True
        os.replace(tmp, path)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


_MERGE_LOCK = threading.RLock()


def update_json(path: Path, **changes: Any) -> dict[str, Any]:
    """Merge `changes` into the object in `path` (written whole), and return it. One merge at
    a time in this process: two threads that both merge (a heartbeat and the main thread)
    never write back what the other replaced. Across processes a file has one merging writer
    (the queue process, for job.json)."""
    with _MERGE_LOCK:
        value = {**read_json(path), **changes}
        write_json(path, value)
        return value


def append_line(path: Path, line: str) -> None:
    """Append one line (a JSON row, an output line) in one write: concurrent appenders never
    interleave within a line, and a reader never sees a line without its newline unless the
    writer died mid-write (readers skip such a last line)."""
    data = (line if line.endswith("\n") else line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A JSON-lines file's whole rows ([] when it is not there); a last line being written (no
    newline yet) or a line that is not an object is left out."""
    try:
        text = path.read_text()
    except OSError:
        return []
    rows = []
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict):
                rows.append(row)
    return rows
