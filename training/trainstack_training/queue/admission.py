"""Admission: which queued jobs may start now. Runs in each job's queue process (process.py), on
whichever node the job was started from, under the runs directory's queue lock.

The cluster has a number of training slots (one per worker node that trains); a job asks for
its ranks (`workers`), one slot each. The records of every run directory (job.json) are the
ledger: a job holds `slots` from its admission until it ends, and a job whose queue process
stopped beating (its node lost) holds nothing. The rule (docs/jobs.md, "The queue"):

- jobs are admitted in order: a higher `priority` first, then the earlier submitted;
- a job starts when every job ahead of it has started and its ranks fit the free slots, all
  of its ranks together (Spark's barrier stage then places them);
- so a job that does not fit holds back every job behind it, even one that would fit: a large
  job is never starved by a stream of small ones; and nothing is pre-empted.

Spark does the placement: a barrier stage starts only when all of its tasks have slots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from trainstack_training.rundir import FINAL_STATES

# A queue process writes its record's heartbeat every 2 s; one silent for longer than this
# has gone (its node with it) and neither holds slots nor keeps a place in the queue.
STALE_SECONDS = 20.0


def alive(record: dict[str, Any], now: float) -> bool:
    return now - float(record.get("heartbeat") or 0) < STALE_SECONDS


def held(record: dict[str, Any], now: float) -> int:
    """The slots a job holds: from its admission until it ends, while it beats."""
    if record.get("state") in FINAL_STATES or not alive(record, now):
        return 0
    return int(record.get("slots") or 0)


def waiting(record: dict[str, Any], now: float) -> bool:
    """A job in the queue: queued, not admitted yet, its queue process beating."""
    return record.get("state") == "queued" and not record.get("slots") and alive(record, now)


def order(record: dict[str, Any]) -> tuple[int, float, str]:
    """The queue's order: higher priority first, then submitted earlier, then by id."""
    return (
        -int(record.get("priority") or 0),
        float(record.get("submitted_at") or 0),
        str(record.get("id") or ""),
    )


@dataclass(frozen=True)
class Verdict:
    admitted: bool
    reason: str  # why not, for `trainstack status` ("" when admitted)
    free: int
    ahead: tuple[str, ...] = ()


def decide(
    mine: dict[str, Any],
    others: list[dict[str, Any]],
    capacity: int,
    now: float | None = None,
) -> Verdict:
    """Whether the job of `mine` (its record) may start now, given the other run
    directories' records and the cluster's `capacity` in slots."""
    now = time.time() if now is None else now
    need = int(mine.get("workers") or 1)
    holders = [(str(r.get("id")), held(r, now)) for r in others if held(r, now)]
    free = capacity - sum(slots for _, slots in holders)
    ahead = tuple(
        str(r.get("id")) for r in sorted(others, key=order)
        if waiting(r, now) and order(r) < order(mine)
    )  # fmt: skip
    slots = f"{need} slot{'s' if need != 1 else ''}"
    if ahead:
        place = f"{len(ahead)} job{'s' if len(ahead) != 1 else ''} ahead ({', '.join(ahead)})"
        return Verdict(False, f"queued: {place}; needs {slots}, {free} of {capacity} free", free,
                       ahead)  # fmt: skip
    if need > free:
        by = ", ".join(f"{job} {n}" for job, n in holders)
        return Verdict(
            False, f"queued: first in line; needs {slots}, {free} of {capacity} free "
            f"(held by {by})", free,
        )  # fmt: skip
    return Verdict(True, "", free)
