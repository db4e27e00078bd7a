"""Several jobs at once (docs/jobs.md, "The queue"): what sharing the cluster buys.

    python bench/bench_concurrent_jobs.py --out bench/results/bench_concurrent_jobs.json [--jobs 6]

Brings up a default stack of its own (2 workers, a training slot each; the node image as
`make up` has it), then, side by side in one run, each phase after one job that leaves the
warm runner up (so neither pays its start):

- **at once**: `--jobs` one-worker digits jobs submitted together; they run two at a time;
- **one at a time**: the same, after `trainstack:concurrentJobs false` and an `up` (the queue
  before several jobs at once: one barrier job at a time, whatever its size).
  For each: the time from the first submit until the last job ended, and each job's own
  start-up in the warm runner (its admission to its first training step: the result's
  `first_step_at` - the record's `started_at`);
- **no starving**: a stream of one-worker jobs, a two-worker job, then more one-worker jobs:
  the two-worker job's wait from the moment it was first in line (every job submitted before
  it had started) until it started, against the length of a one-worker job.

The stack is destroyed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import emit
from tests.support.stacks import ROOT, Stack

EXAMPLE = ROOT / "examples" / "digits"
CONFIG = {"uiPortBase": "0", "monitoringPort": "0", "trainEpochs": "8", "trainWorkers": "2"}
ENDED = ("succeeded", "failed", "cancelled")


def cli(stack: Stack, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infra.jobs.cli", "-s", stack.name, *args],
        cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def submit(stack: Stack, *args: str) -> str:
    proc = cli(stack, "submit", str(EXAMPLE), *args)
    if proc.returncode != 0:
        raise SystemExit(f"submit failed: {proc.stderr}")
    return proc.stdout.strip()


def records(stack: Stack) -> dict[str, dict[str, Any]]:
    listed = cli(stack, "list", "--json")
    return {r["id"]: r for r in json.loads(listed.stdout)} if listed.returncode == 0 else {}


def wait_ended(stack: Stack, job_ids: list[str], timeout: float = 1800) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = records(stack)
        if all(found.get(j, {}).get("state") in ENDED for j in job_ids):
            failed = [j for j in job_ids if found[j]["state"] != "succeeded"]
            if failed:
                raise SystemExit(f"jobs did not succeed: {[found[j] for j in failed]}")
            return {j: found[j] for j in job_ids}
        time.sleep(1.0)
    raise SystemExit(f"jobs not ended within {timeout:.0f} s: {job_ids}")


def startup(record: dict[str, Any]) -> float:
    """The job's own start-up: its driver's start (admission) to its first training step."""
    return round(float(record["result"]["first_step_at"]) - float(record["started_at"]), 2)


def summary(records_: dict[str, dict], started: float) -> dict[str, Any]:
    ends = [float(r["ended_at"]) for r in records_.values()]
    lengths = [float(r["ended_at"]) - float(r["started_at"]) for r in records_.values()]
    starts = [startup(r) for r in records_.values()]
    return {
        "until_last_ended_s": round(max(ends) - started, 1),
        "job_length_s": {
            "median": round(statistics.median(lengths), 1),
            "max": round(max(lengths), 1),
        },
        "startup_to_first_step_s": {
            "median": round(statistics.median(starts), 2),
            "max": round(max(starts), 2),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--jobs", type=int, default=6)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "config": CONFIG,
        "jobs": args.jobs,
        "job": "examples/digits, 8 epochs, --workers 1",
    }
    one = ("--workers", "1")
    with tempfile.TemporaryDirectory() as tmp:
        stack = Stack(Path(tmp) / "state", prefix="tsbench")
        try:
            stack.init(**CONFIG)
            stack.up()
            wait_ended(stack, [submit(stack, *one)])  # the warm runner is up from here

            started = time.time()
            together = [submit(stack, *one) for _ in range(args.jobs)]
            result["at_once"] = summary(wait_ended(stack, together), started)

            before = [submit(stack, *one) for _ in range(3)]
            large = submit(stack, "--workers", "2")
            after = [submit(stack, *one) for _ in range(3)]
            found = wait_ended(stack, [*before, large, *after])
            first_in_line = max(float(found[j]["started_at"]) for j in before)
            one_length = statistics.median(
                float(found[j]["ended_at"]) - float(found[j]["started_at"]) for j in before
            )
            result["no_starving"] = {
                "large_job_wait_after_first_in_line_s": round(
                    float(found[large]["started_at"]) - first_in_line, 1
                ),
                "one_worker_job_length_s": round(one_length, 1),
                "later_small_jobs_started_before_it": sum(
                    float(found[j]["started_at"]) < float(found[large]["started_at"]) for j in after
                ),
            }

            stack.set_config(concurrentJobs="false")
            stack.up()
            wait_ended(stack, [submit(stack, *one)])  # the same warm start as the other phase
            started = time.time()
            together = [submit(stack, *one) for _ in range(args.jobs)]
            result["one_at_a_time"] = summary(wait_ended(stack, together), started)
            result["speed_up"] = round(
                result["one_at_a_time"]["until_last_ended_s"]
                / result["at_once"]["until_last_ended_s"],
                2,
            )

        finally:
            stack.destroy_and_remove()
    emit(result, args.out)


if __name__ == "__main__":
    main()
