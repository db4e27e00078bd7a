"""The `trainstack` command against the shared stack, for the platform tests: run it, read a
job's record (through `status`, or its file on the shared storage for a wait), follow a job
to its end, cancel one mid-training and check that none of its processes is left on any
node."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.support.jobs import JobWatch
from tests.support.stacks import ROOT, wait_until

from .conftest import MODELS, sh

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


def record(platform, job_id: str) -> dict:
    """The job's record as the runner keeps it (RUN_DIR/job.json on the shared storage, read
    on control-3), which `status --json` shows: for a wait, without a Python start and a
    `pulumi stack output` for each read. {} while it cannot be read."""
    code, out = sh(platform.container("control-3"), f"cat {MODELS}/{job_id}/job.json")
    try:
        return dict(json.loads(out)) if code == 0 else {}
    except ValueError:
        return {}


def wait_state(platform, job_id: str, states: tuple[str, ...], timeout: float = 600) -> dict:
    """The job's record once its state is one of `states` (read from its record file)."""
    return wait_until(
        f"job {job_id} in {states}",
        lambda: (r := record(platform, job_id)).get("state") in states and r,
        timeout,
        up_to=5.0,
    )


def workers(platform) -> list[str]:
    """The worker nodes' containers, as the stack has them now (test_60_scaling adds a
    third; a run of some modules alone has two)."""
    nodes = platform.outputs()["nodes"]
    found = [n["container"] for n in nodes if n["name"].startswith("worker-")]
    assert found, nodes
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


RANK_HEADER = re.compile(r"^--- rank (\d+), attempt \d+, on (\S+), ", re.M)


def rank_hosts(platform, job_id: str) -> dict[int, str]:
    """Each rank's host, from the header of its log (ranklog.py) on the shared storage."""
    code, out = sh(platform.container("control-3"), f"cat {MODELS}/{job_id}/rank-*.log")
    return {int(r): host for r, host in RANK_HEADER.findall(out)} if code == 0 else {}


def job_nodes(platform) -> list[str]:
    """The containers of the nodes that run a job's processes: the stack's `jobNodes` (the job
    drivers' node, where its queue process and driver run, then the workers, where its ranks
    run)."""
    found = [n["container"] for n in platform.outputs()["jobNodes"]]
    assert found, platform.outputs()["jobNodes"]
    return found


def cancel_mid_training(platform, job: Path) -> str:
    """Submit a long run of `job`, cancel it after its first epoch, and check that no process
    of it is left on any node within 30 s and that it is recorded as cancelled; its id.

    What the job runs is recorded first (tests/support/jobs.py, JobWatch): every process of
    the job user on the job nodes (the drivers' node and the workers) that was not there
    before the submit (less a warm runner it
    may have started, which stays by design), ranks included: one at least on each node that
    the ranks' logs name. After the cancel those very processes (PID and start time) must be
    gone."""
    watch = JobWatch(sh, job_nodes(platform))
    submitted = trainstack(platform, "submit", str(job), "--epochs", "400")
    job_id = submitted.stdout.strip()
    assert submitted.returncode == 0, submitted.stderr
    run_dir = f"{MODELS}/{job_id}"
    container = platform.container("control-3")
    wait_until(
        "the job's first epoch",
        lambda: sh(container, f"test -s {run_dir}/epochs.jsonl")[0] == 0,
        300,
        up_to=5.0,
    )
    size = int(record(platform, job_id)["workers"])

    def every_rank_seen() -> bool:
        watch.sample()
        hosts = rank_hosts(platform, job_id)
        nodes = {p.node for p in watch.ranks.values()}
        return (
            len(hosts) == size
            and len(watch.ranks) >= size
            and len(nodes) >= len(set(hosts.values()))
        )

    try:
        wait_until(
            "the job's ranks on each node its rank logs name", every_rank_seen, 60, up_to=5.0
        )
    except AssertionError as exc:
        ranks = "\n".join(map(str, watch.ranks.values()))
        raise AssertionError(
            f"{exc}\nrank logs: {rank_hosts(platform, job_id)}\nranks seen:\n{ranks}\n"
            "the job's other processes:\n" + "\n".join(map(str, watch.seen.values()))
        ) from None
    seen = "\n".join(map(str, watch.seen.values()))
    assert any("trainstack_training.queue" in p.cmdline for p in watch.seen.values()), seen
    assert any("bin/trainstack-train" in p.cmdline for p in watch.seen.values()), seen
    stop = trainstack(platform, "cancel", job_id, timeout=60)
    assert stop.returncode == 0 and "cancelled" in stop.stdout, stop.stdout + stop.stderr
    # cancel returns once the runner has recorded the end: the driver has cancelled its
    # Spark jobs; Spark's executors then end their barrier tasks (a second or two here).
    left = watch.wait_gone(30)
    assert not left, "30 s after cancel, still running:\n" + "\n".join(map(str, left))
    assert status(platform, job_id)["state"] == "cancelled"
    return job_id
