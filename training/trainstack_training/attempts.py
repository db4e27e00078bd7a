"""The run's barrier-stage attempts: one line each in the run directory's attempts.log,
written by the first task of every attempt (launcher.py), counted by the report."""

from __future__ import annotations

import time
from pathlib import Path

ATTEMPTS_LOG = "attempts.log"


def record_attempt(out: Path, host: str) -> None:
    """Append one line for a barrier-stage attempt that has started."""
    with (out / ATTEMPTS_LOG).open("a") as fh:
        fh.write(f"{time.time():.3f} {host}\n")


def count_attempts(out: Path) -> int:
    """The barrier-stage attempts the run has started so far."""
    log = out / ATTEMPTS_LOG
    return len(log.read_text().splitlines()) if log.exists() else 0
