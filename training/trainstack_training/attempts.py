"""The run's launches, barrier-stage attempts and failure. attempts.log: one line for each
attempt, written by the first task of every attempt (launcher.py), counted by the report.
launch.json: when this launch of the run started, written by the launcher when it starts the
run afresh (a run resumed from its backup keeps it). failed.json: how a launch that did not
succeed ended (`trainstack-train`'s error line, cli.py), dropped by the next launch. The
tracking sync reads both for the stack's declared job, which has no job record: one MLflow run
per launch, FAILED (or KILLED) with the error when it did not succeed."""

from __future__ import annotations

import json
import time
from pathlib import Path

ATTEMPTS_LOG = "attempts.log"
LAUNCH_FILE = "launch.json"
FAILED_FILE = "failed.json"
# trainstack-train's exit code for a cancelled job (cli.py); failed.json's `exit` then means
# the run was cancelled, not failed (the tracking sync's KILLED).
EXIT_CANCELLED = 130


def _write_json(path: Path, value: dict[str, object]) -> None:
    """Write `path` whole or not at all (a reader never sees half of it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)


def record_launch(out: Path, *, fresh: bool) -> None:
    """Stamp a launch of the run: a fresh one always, a resumed one when it has no stamp."""
    path = out / LAUNCH_FILE
    if fresh or not path.exists():
        _write_json(path, {"launched_at": round(time.time(), 3)})


def launched_at(out: Path) -> float | None:
    """When the run's current launch started (None: a run from before launch stamps)."""
    try:
        value = json.loads((out / LAUNCH_FILE).read_text()).get("launched_at")
        return float(value)
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def record_attempt(out: Path, host: str) -> None:
    """Append one line for a barrier-stage attempt that has started."""
    with (out / ATTEMPTS_LOG).open("a") as fh:
        fh.write(f"{time.time():.3f} {host}\n")


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
    _write_json(out / FAILED_FILE, record)
