"""The run's launches, barrier-stage attempts and failure. attempts.log: one line for each
attempt, written by the first task of every attempt (launcher.py), counted by the report.
launch.json: when this launch of the run started, written by the launcher when it starts the
run afresh (a run resumed from its backup keeps it). failed.json: how a launch that did not
succeed ended (`trainstack-train`'s error line, cli.py), dropped by the next launch. The
tracking sync reads launch.json for the stack's declared job (one MLflow run per launch), and
both for a declared run from before it had a job record (tracking.runfiles.earlier_record).
Runs in the driver (`trainstack-train`) and its ranks."""

from __future__ import annotations

import time
from pathlib import Path

from trainstack_training.rundir import (
    ATTEMPTS_LOG,
    FAILED_FILE,
    LAUNCH_FILE,
    RECORD,
    append_line,
    read_json,
    write_json,
)

# trainstack-train's exit code for a cancelled job (cli.py); failed.json's `exit` then means
# the run was cancelled, not failed (the tracking sync's KILLED).
EXIT_CANCELLED = 130


def record_launch(out: Path, *, fresh: bool) -> None:
    """Stamp a launch of the run: a fresh one always, a resumed one when it has no stamp. The
    stamp names the job record it was made for (its `submitted_at`): the stack's declared job
    gets a new record at every launch, and until its driver has stamped this one, the
    directory's launch.json is an earlier launch's (tracking.runfiles: not synced yet)."""
    stamp = None if fresh else launched_at(out)
    if stamp is None:
        stamp = round(time.time(), 3)
    record = read_json(out / RECORD).get("submitted_at")
    write_json(out / LAUNCH_FILE, {"launched_at": stamp, "record": record})


def launch_record(out: Path) -> object:
    """The job record's `submitted_at` the run's launch stamp was made for (None: none)."""
    return read_json(out / LAUNCH_FILE).get("record")


def launched_at(out: Path) -> float | None:
    """When the run's current launch started (None: a run from before launch stamps)."""
    try:
        return float(read_json(out / LAUNCH_FILE)["launched_at"])
    except (KeyError, ValueError, TypeError):
        return None


def record_attempt(out: Path, host: str) -> None:
    """Append one line for a barrier-stage attempt that has started."""
    append_line(out / ATTEMPTS_LOG, f"{time.time():.3f} {host}")


def count_attempts(out: Path) -> int:
    """The barrier-stage attempts the run has started so far."""
    log = out / ATTEMPTS_LOG
    return len(log.read_text().splitlines()) if log.exists() else 0


def record_failure(out: Path, error: str, kind: str, exit_code: int) -> None:
    """Record how this launch ended when it did not succeed (nothing when `out` is not there:
    the job failed before it had a run directory)."""
    if not out.is_dir():
        return
    record = {"error": error, "kind": kind, "exit": exit_code, "ended_at": round(time.time(), 3)}
    write_json(out / FAILED_FILE, record)
