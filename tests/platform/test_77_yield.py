"""The warm runner yields the cluster to other Spark applications (docs/jobs.md, "The warm
runner"; trainstack:runnerYield, on by default), on the shared stack: a plain PySpark
application of the test's own, not trainstack's code, is run on the cluster's multi-master URL
with the cluster's client config, as a user's own data preparation would be.

In file order, each test leaving the stack as the next expects:
  1. with the runner up and idle, the plain application gets the cores and finishes; the
     runner's log says why it stopped; Prometheus counts the yield;
  2. the next trainstack job starts the runner again, and runs;
  3. a plain application submitted while a job trains waits (the job is not pre-empted), and
     runs after it;
  4. a trainstack job submitted while a plain application holds the cores is `queued`, says
     for what, and runs after it.
The last job leaves a warm runner up, as the drills (test_80) expect to find.

What it costs: about 4 minutes, mostly the cold starts that yielding implies (the runner
twice, each plain application's driver once). The time a plain application waits is measured
by bench/bench_yield.py (goal 10 s), not here: these tests only tell a yield (seconds) from the
keep-alive (30 minutes on this stack).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from trainstack_training.warm import LOG as RUNNER_LOG
from trainstack_training.warm import STATE_DIR_PREFIX

from tests.support.failover import master_status
from tests.support.jobs import regression_full_mode
from tests.support.plain_spark import PlainApp
from tests.support.prometheus import instant
from tests.support.stacks import wait_until

from .cli import EXAMPLES, status, trainstack
from .conftest import MODELS, epoch_rows, sh

pytestmark = pytest.mark.e2e

# The node that runs the plain applications' drivers: the job drivers' node (a control node
# with no master, which no test before this one stops), beside the warm runner's driver, as a
# user's own application started there would be.
DRIVER_NODE = "control-3"
DIGITS = EXAMPLES / "digits"
WAIT_HOLD = f"{MODELS}/.test-yield-hold"  # the held job's own wait (tests/support/jobs.py)


@pytest.fixture
def plain(platform: Any) -> Iterator[Callable[..., PlainApp]]:
    """Start plain applications on DRIVER_NODE; none outlives the test."""
    started: list[PlainApp] = []

    def start(name: str, hold: float = 0.0) -> PlainApp:
        started.append(PlainApp(platform.container(DRIVER_NODE), name, hold))
        return started[-1]

    yield start
    for app in started:
        app.stop()


def alive_page(platform: Any) -> dict[str, Any]:
    """The ALIVE master's JSON page, read from this machine (not with trainstack's code)."""
    outputs = platform.outputs()
    masters = [n for n in outputs["nodes"] if "spark_master" in n["roles"]]

    def alive() -> dict[str, Any] | None:
        for m in masters:
            ip = subprocess.run(
                ["docker", "inspect", "-f",
                 "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", m["container"]],
                capture_output=True, text=True, check=False,
            ).stdout.strip()  # fmt: skip
            page = master_status(ip) if ip else None
            if page and page.get("status") == "ALIVE":
                return page
        return None

    return wait_until("an ALIVE master's page", alive, 60)


def active_app(platform: Any, name: str) -> dict[str, Any] | None:
    return next((a for a in alive_page(platform)["activeapps"] if a["name"] == name), None)


def runner_logs(platform: Any) -> str:
    """The warm-runner log of every node that submits jobs (jobNodes: the drivers' node, then
    the workers; the runner runs on the one that submitted, and its log stays there)."""
    text = []
    for node in platform.outputs()["jobNodes"]:
        _, out = sh(node["container"], f"cat {STATE_DIR_PREFIX}*/{RUNNER_LOG} 2>/dev/null")
        text.append(out)
    return "\n".join(text)


def runner_up(platform: Any) -> bool:
    """The runner's registration on the shared storage is fresh (it beats every 3 s)."""
    code, out = sh(platform.container(DRIVER_NODE), f"cat {MODELS}/.warm-runner.json")
    return code == 0 and time.time() - float(json.loads(out)["heartbeat"]) < 10


def yields(platform: Any) -> float:
    result = instant(platform.outputs()["monitoringUrl"], "trainstack_runner_yields_total")
    return float(result[0]["value"][1]) if result else 0.0


def run_job(platform: Any, job: Path, *args: str) -> str:
    """Submit `job`; its job id."""
    submitted = trainstack(platform, "submit", str(job), *args, "--json")
    assert submitted.returncode == 0, submitted.stderr
    return str(json.loads(submitted.stdout)["job_id"])


def follow(platform: Any, job_id: str) -> str:
    """`trainstack logs -f` until the job ends; it must have succeeded."""
    logs = trainstack(platform, "logs", "-f", job_id, timeout=600)
    assert logs.returncode == 0 and "[trainstack] job succeeded" in logs.stdout, (
        logs.stdout[-3000:] + logs.stderr
    )
    return logs.stdout


def test_an_idle_runner_gives_the_cores_to_a_plain_application(platform, plain):
    follow(platform, run_job(platform, DIGITS, "--epochs", "1"))  # the runner is up, and idle now
    assert runner_up(platform), "no warm runner after a job"
    counted = yields(platform)
    app = plain("idle")
    done = app.result(timeout=300)
    # The runner's keep-alive on this stack is 30 minutes: without the yield it would wait.
    waited = done["first_task"] - done["up"]
    assert waited < 120, f"the first task started {waited:.0f} s after the context was up"
    log = runner_logs(platform)
    assert f"stopping: yielding the cores to application {done['app']} ({app.name})" in (log), log[
        -3000:
    ]
    wait_until("the runner gone", lambda: not runner_up(platform), 30)
    wait_until("the yield counted in Prometheus", lambda: yields(platform) >= counted + 1, 60)


def test_the_next_job_starts_the_runner_again(platform):
    job_id = run_job(platform, DIGITS, "--epochs", "1")
    logs = follow(platform, job_id)
    assert "warm runner started" in logs, logs[-3000:]
    assert status(platform, job_id)["result"]["spark_application"] == "warm-runner started"


def test_a_plain_application_waits_for_a_training_job_and_runs_after_it(platform, plain, tmp_path):
    # The job trains, then waits in its barrier stage, holding its cores, while WAIT_HOLD is
    # there (`trainstack submit` takes no test hold file: the job's own code waits).
    control = platform.container(DRIVER_NODE)
    assert sh(control, f"touch {WAIT_HOLD} && chmod 644 {WAIT_HOLD}")[0] == 0
    try:
        job = regression_full_mode(EXAMPLES, tmp_path / "held", hold=WAIT_HOLD)
        job_id = run_job(platform, job, "--epochs", "1")
        run_dir = f"{MODELS}/{job_id}"
        wait_until("the job's epoch", lambda: epoch_rows(platform, run_dir), 300)
        app = plain("behind")
        waiting = wait_until(
            "the plain application registered", lambda: active_app(platform, app.name), 180
        )
        time.sleep(5)  # the idle check runs every second: a pre-emption would show by now
        still = active_app(platform, app.name)
        assert still and still["state"] == "WAITING" and still["cores"] == 0, still
        assert status(platform, job_id)["state"] == "running"
        released = time.time()
    finally:
        sh(control, f"rm -f {WAIT_HOLD}")
    follow(platform, job_id)
    done = app.result(timeout=300)
    assert done["first_task"] > released, (done, released)
    assert done["app"] == waiting["id"]
    assert f"yielding the cores to application {done['app']} ({app.name})" in (
        runner_logs(platform)
    )


def test_a_job_waits_for_cores_a_plain_application_holds_and_runs_after_it(platform, plain):
    app = plain("holds", hold=40)
    holder = wait_until(
        "the plain application's tasks running",
        lambda: (a := active_app(platform, app.name)) and a["cores"] > 0 and a,
        180,
    )
    job_id = run_job(platform, DIGITS, "--epochs", "1")
    why = f"queued: waiting for cores held by application {holder['id']} ({app.name})"
    record = wait_until(
        "the job queued for the cores",
        lambda: (r := status(platform, job_id))["state"] == "queued" and r.get("waiting_for") and r,
        180,
        every=3,  # each `trainstack status` is a Python start: no half-second spin
    )
    assert record["waiting_for"] == why, record
    shown = trainstack(platform, "status", job_id)
    assert why in shown.stdout, shown.stdout
    done = app.result(timeout=300)
    logs = follow(platform, job_id)
    assert f"[trainstack] {why}" in logs and "the cores are free" in logs, logs[-3000:]
    record = status(platform, job_id)
    assert record["state"] == "succeeded" and not record.get("waiting_for"), record
    assert record["result"]["first_step_at"] > done["ended"] - 5, (record["result"], done)
