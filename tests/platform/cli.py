"""The `trainstack` command against the shared stack, for the platform tests: run it, read a
job's record, follow a job to its end, cancel one mid-training and check that nothing of it
is left on any node."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tests.support.jobs import JOB_PROCESSES
from tests.support.stacks import ROOT, wait_until

from .conftest import WORKERS, sh

EXAMPLES = ROOT / "examples"
CLI = [sys.executable, "-m", "infra.jobs.cli"]


def trainstack(platform, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "-s", platform.stack.name, *args],
        cwd=ROOT,
        env=platform.stack.env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def status(platform, job_id: str) -> dict:
    proc = trainstack(platform, "status", job_id, "--json")
    assert proc.stdout.startswith("{"), proc.stderr
    return json.loads(proc.stdout)


def job_processes(platform) -> dict[str, str]:
    """The job's processes (runner, driver, TensorFlow workers) on every worker node."""
    found = {}
    for i in range(1, WORKERS + 2):
        container = platform.container(f"worker-{i}")
        code, out = sh(container, JOB_PROCESSES)
        if code == 0 and out.strip():
            found[container] = out.strip()
    return found


def submit_and_follow(platform, job: Path, *args: str, timeout: int = 600) -> tuple[dict, str]:
    """Submit `job`, follow its logs to the end; its record (it must have succeeded) and its
    logs (no traceback in them)."""
    submitted = trainstack(platform, "submit", str(job), *args, timeout=timeout)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    logs = trainstack(platform, "logs", "-f", job_id, timeout=timeout)
    assert logs.returncode == 0, logs.stdout[-3000:] + logs.stderr
    assert "Traceback" not in logs.stdout, logs.stdout[-3000:]
    record = status(platform, job_id)
    assert record["state"] == "succeeded", record
    return record, logs.stdout


def cancel_mid_training(platform, job: Path) -> str:
    """Submit a long run of `job`, cancel it after its first epoch, and check that no process
    of it is left on any worker node within 30 s and that it is recorded as cancelled; its id."""
    submitted = trainstack(platform, "submit", str(job), "--epochs", "400")
    job_id = submitted.stdout.strip()
    assert submitted.returncode == 0, submitted.stderr
    run_dir = f"/srv/trainstack/models/{job_id}"
    container = platform.container("control-3")
    wait_until(
        "the job's first epoch",
        lambda: sh(container, f"test -s {run_dir}/epochs.jsonl")[0] == 0,
        300,
    )
    assert job_processes(platform), "the job was not running on any worker"
    stop = trainstack(platform, "cancel", job_id, timeout=60)
    assert stop.returncode == 0 and "cancelled" in stop.stdout, stop.stdout + stop.stderr
    # cancel returns once the runner has recorded the end: the driver has cancelled its
    # Spark jobs; Spark's executors then end their barrier tasks (a second or two here).
    stopped = time.monotonic()
    while job_processes(platform) and time.monotonic() - stopped < 30:
        time.sleep(0.5)
    left = job_processes(platform)
    assert not left, f"{time.monotonic() - stopped:.0f} s after cancel: {left}"
    assert status(platform, job_id)["state"] == "cancelled"
    return job_id
