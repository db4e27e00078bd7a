"""PyTorch jobs through `trainstack submit` on the shared stack (docs/jobs.md, "PyTorch
jobs"): the first torch job installs torch into the packages overlay (once per cluster),
trains the digits with trainstack's DDP loop on two ranks (gloo) in the warm runner; a
full-mode torch job reuses the overlay; a cancelled torch job leaves no process."""

from __future__ import annotations

import time

import pytest

from tests.support.stacks import wait_until

from .conftest import sh
from .test_76_submit import EXAMPLES, job_processes, status, trainstack

pytestmark = pytest.mark.e2e


def run(platform, job, *args: str) -> tuple[dict, str]:
    submitted = trainstack(platform, "submit", str(job), *args, timeout=900)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    logs = trainstack(platform, "logs", "-f", job_id, timeout=900)
    assert logs.returncode == 0, logs.stdout[-3000:] + logs.stderr
    assert "Traceback" not in logs.stdout, logs.stdout[-3000:]
    record = status(platform, job_id)
    assert record["state"] == "succeeded", record
    return record, logs.stdout


def test_the_torch_digits_example_trains_on_the_cluster(platform):
    record, logs = run(platform, EXAMPLES / "digits-torch", "--epochs", "10")
    result = record["result"]
    assert result["framework"] == "torch" and result["workers"] == 2, result
    assert result["final_val_accuracy"] >= 0.93, result
    assert set(result["final"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}, result
    run_dir = f"/srv/trainstack/models/{record['id']}"
    container = platform.container("control-3")
    assert sh(container, f"test -s {run_dir}/model.pt && test -s {run_dir}/model.pt2")[0] == 0
    print(f"first torch job: {result['total_seconds']:.1f} s of job; logs:\n{logs[-1500:]}")


def test_a_full_mode_torch_job_reuses_the_installed_torch(platform):
    record, logs = run(platform, EXAMPLES / "digits-torch-cnn", "--epochs", "3")
    assert "installing the job's packages" not in logs, logs[-2000:]
    result = record["result"]
    assert record["mode"] == "full" and result["framework"] == "torch", record
    assert result["final"]["val_accuracy"] >= 0.85, result


def test_cancel_stops_a_torch_job_and_leaves_no_process(platform):
    submitted = trainstack(platform, "submit", str(EXAMPLES / "digits-torch"), "--epochs", "400")
    job_id = submitted.stdout.strip()
    assert submitted.returncode == 0, submitted.stderr
    run_dir = f"/srv/trainstack/models/{job_id}"
    container = platform.container("control-3")
    wait_until(
        "the torch job's first epoch",
        lambda: sh(container, f"test -s {run_dir}/epochs.jsonl")[0] == 0,
        300,
    )
    assert job_processes(platform), "the job was not running on any worker"
    stop = trainstack(platform, "cancel", job_id, timeout=60)
    assert stop.returncode == 0 and "cancelled" in stop.stdout, stop.stdout + stop.stderr
    stopped = time.monotonic()
    while job_processes(platform) and time.monotonic() - stopped < 30:
        time.sleep(0.5)
    left = job_processes(platform)
    assert not left, f"{time.monotonic() - stopped:.0f} s after cancel: {left}"
    assert status(platform, job_id)["state"] == "cancelled"
