"""The warm runner (trainstack_training.warm) in local[2], real Spark and TensorFlow: a second
job runs in the application the first one started, in a fresh process of its own; the runner
gives the cores back after its keep-alive; a job with other Spark settings gets a runner of
its own settings; a job killed mid-run leaves no Spark job behind in the runner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import DIGITS_JOB, run_cli

pytestmark = pytest.mark.training

# One TensorFlow worker and one epoch: what the runner does is the same for any job size.
JOB = ["--master", "local[2]", "--workers", "1", "--epochs", "1", "--rows", "400"]


def _info(state: Path) -> dict:
    path = state / "runner.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")", 1)[1].split()[0] == "Z")


def _wait(what: str, check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The runner's directory for this module's jobs (TRAINSTACK_WARM_DIR), which run in
    file order in one runner; the runner is stopped after."""
    path = tmp_path_factory.mktemp("warm") / "state"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINSTACK_WARM_DIR", str(path))
        yield path
    pid = int(_info(path).get("pid", 0))
    if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        _wait("the runner stopping on SIGTERM", lambda: not _alive(pid), 30)


def _metrics(summary: dict) -> dict:
    return json.loads(Path(summary["metrics_path"]).read_text())


def test_a_second_job_runs_in_the_application_the_first_started(state, tmp_path):
    rc, first, err = run_cli([*JOB, "--runner-keep-alive", "120", "--output", str(tmp_path / "a")])
    assert rc == 0, err[-3000:]
    assert "warm runner started" in err, err[-2000:]
    runner = _info(state)
    assert runner and _alive(runner["pid"]), f"no runner after the first job: {runner}"
    assert oct((state / "runner.json").stat().st_mode & 0o777) == "0o600"
    assert oct(state.stat().st_mode & 0o777) == "0o700"
    rc, second, err = run_cli([*JOB, "--runner-keep-alive", "120", "--output", str(tmp_path / "b")])
    assert rc == 0, err[-3000:]
    assert "running in the warm runner" in err, err[-2000:]
    assert _info(state)["app_id"] == runner["app_id"] and _info(state)["pid"] == runner["pid"]
    assert second["epochs"] == 1 and 0 <= second["final_val_accuracy"] <= 1, second
    # Each says where its application came from (metrics.json, the `training` output);
    # what the warm start saves is measured by bench/bench_runner.py, not here.
    assert _metrics(first)["spark_application"] == "warm-runner started"
    assert _metrics(second)["spark_application"] == "warm-runner"


def test_two_jobs_train_at_once_in_one_runner(state, tmp_path):
    """Two one-worker jobs on local[2]'s two slots, in one runner: the first holds its slot at
    its first epoch's end; the second's distributed data stage (Spark SQL jobs, local_prep_mb
    0) and then its barrier stage run on the other slot meanwhile, each job in a pool of its
    own under the FAIR scheduler (no deadlock of a data stage and a barrier stage waiting for
    slots); both finish once the hold is gone."""
    hold = tmp_path / "hold"
    hold.write_text("")
    outs = [tmp_path / "one", tmp_path / "two"]
    extra = [[], ["--local-prep-mb", "0"]]

    def start(out: Path, more: list[str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "trainstack_training", "--job-dir", DIGITS_JOB, *JOB,
             "--epochs", "2", "--runner-keep-alive", "120", "--output", str(out),
             "--hold-file", str(hold), *more],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    jobs = [start(outs[0], extra[0])]
    try:
        _wait("the first job at its first epoch's end", (outs[0] / "epochs.jsonl").exists, 300)
        jobs.append(start(outs[1], extra[1]))
        _wait("the second job at its first epoch's end", (outs[1] / "epochs.jsonl").exists, 300)
        hold.unlink()
        results = [job.communicate(timeout=300) for job in jobs]
    finally:
        hold.unlink(missing_ok=True)
        for job in jobs:
            if job.poll() is None:
                job.kill()
    for job, (stdout, stderr) in zip(jobs, results, strict=True):
        assert job.returncode == 0, stderr[-3000:]
        assert json.loads(stdout.splitlines()[-1])["epochs"] == 2
    metrics = [json.loads((out / "metrics.json").read_text()) for out in outs]
    assert {m["spark_application_id"] for m in metrics} == {_info(state)["app_id"]}
    assert metrics[1]["data_path"] == "spark", metrics[1].get("data_path")


def test_a_job_killed_mid_run_leaves_no_spark_job_in_the_runner(state, tmp_path):
    out = tmp_path / "killed"
    hold = tmp_path / "hold"  # its workers wait at the first epoch's end while this exists
    hold.write_text("")
    args = [
        *JOB, "--workers", "2", "--epochs", "3", "--runner-keep-alive", "120",
        "--output", str(out), "--hold-file", str(hold), "--job-dir", DIGITS_JOB,
    ]  # fmt: skip
    job = subprocess.Popen(
        [sys.executable, "-m", "trainstack_training", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait("the first epoch", lambda: (out / "epochs.jsonl").exists(), 300)
        runner = _info(state)
        os.kill(job.pid, signal.SIGKILL)
        job.wait(10)
        log = state / "runner.log"
        _wait(
            "the runner cancelling the killed job's Spark jobs",
            lambda: "ended without detaching: cancelling" in log.read_text(),
            30,
        )
        assert _alive(runner["pid"])
        # Its held barrier tasks held both slots: the next job gets one only if they went.
        rc, _, err = run_cli(
            [*JOB, "--runner-keep-alive", "120", "--output", str(tmp_path / "next")]
        )
        assert rc == 0 and "running in the warm runner" in err, err[-3000:]
    finally:
        hold.unlink(missing_ok=True)
        if job.poll() is None:
            job.kill()


def test_other_settings_start_it_again_and_it_stops_after_its_keep_alive(state, tmp_path):
    before = _info(state)
    assert before, "no runner from the earlier tests"
    other = ["--spark-conf", "spark.sql.shuffle.partitions=3", "--output", str(tmp_path / "c")]
    rc, _, err = run_cli([*JOB, "--runner-keep-alive", "3", *other])
    assert rc == 0, err[-3000:]
    assert "other Spark settings" in err and "warm runner started" in err, err[-2000:]
    assert not _alive(before["pid"])
    log = state / "runner.log"
    _wait(
        "the idle runner stopping after 3 s",
        lambda: "stopping: idle for 3 s" in log.read_text(),
        60,
    )
    _wait("its runner.json removed", lambda: not (state / "runner.json").exists(), 30)
    started = [
        int(line.split("pid ")[1].split(",")[0])
        for line in err.splitlines()
        if "warm runner started (pid " in line
    ]
    assert started, err[-2000:]
    _wait("the runner's process gone", lambda: not _alive(started[0]), 60)
