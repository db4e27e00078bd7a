"""PyTorch jobs through `trainstack submit` on the shared stack (docs/jobs.md, "PyTorch
jobs"): the first torch job installs torch into the packages overlay (once per cluster: one
install in its log, one complete overlay), trains the digits with trainstack's DDP loop on two
ranks (gloo, in their logs) in the warm runner (its result says so); a full-mode torch job
reuses the overlay; a cancelled torch job leaves no process (its ranks seen first)."""

from __future__ import annotations

import json
import re

import pytest

from .cli import EXAMPLES, cancel_mid_training, status, submit_and_follow, trainstack
from .conftest import MODELS, sh

pytestmark = pytest.mark.e2e


def test_the_torch_digits_example_trains_on_the_cluster(platform):
    submitted = trainstack(
        platform, "submit", str(EXAMPLES / "digits-torch"), "--epochs", "10", "--json"
    )
    assert submitted.returncode == 0, submitted.stderr
    # The first torch job of the stack: its lock is new to the cluster, so submit ships torch
    # and the job installs it, once, into the overlay on the shared storage.
    assert re.search(r"packages \S+ shipped to the cluster \(.*\btorch\b", submitted.stderr), (
        submitted.stderr
    )
    job_id = json.loads(submitted.stdout)["job_id"]
    logs = trainstack(platform, "logs", "-f", job_id, timeout=900)
    assert logs.returncode == 0, logs.stdout[-3000:] + logs.stderr
    assert "Traceback" not in logs.stdout, logs.stdout[-3000:]
    assert logs.stdout.count("[trainstack] installing the job's packages on the cluster") == 1
    assert logs.stdout.count("[trainstack] packages installed in ") == 1, logs.stdout[-3000:]
    record = status(platform, job_id)
    assert record["state"] == "succeeded" and record["env_sha"], record
    envs = f"{MODELS}/envs"
    container = platform.container("control-3")
    code, out = sh(
        container,
        f"test -f {envs}/{record['env_sha']}/.complete && "
        f"test -d {envs}/{record['env_sha']}/site/torch && ls -a {envs}",
    )
    assert code == 0, out
    sha = record["env_sha"]
    # Nothing half done: no partial install, no wheel archive left (envs.install_script).
    assert not [n for n in out.split() if n.startswith((f"{sha}.partial", f".{sha}."))], out
    result = record["result"]
    assert result["framework"] == "torch" and result["workers"] == 2, result
    # In the warm runner (started by this job, or up from an earlier one), not an application
    # of its own.
    assert result["spark_application"] in ("warm-runner", "warm-runner started"), result
    assert result["final_val_accuracy"] >= 0.93, result
    assert set(result["final"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}, result
    # Each rank's own log: the process group on gloo (CPU), two ranks.
    for rank in (0, 1):
        ranks = trainstack(platform, "logs", "--rank", str(rank), job_id)
        assert ranks.returncode == 0, ranks.stderr
        assert f"process group: gloo, rank {rank} of 2, on cpu" in ranks.stdout, ranks.stdout[
            -3000:
        ]
    run_dir = f"{MODELS}/{job_id}"
    assert sh(container, f"test -s {run_dir}/model.pt && test -s {run_dir}/model.pt2")[0] == 0
    print(f"first torch job: {result['total_seconds']:.1f} s of job; logs:\n{logs.stdout[-1500:]}")


def test_a_full_mode_torch_job_reuses_the_installed_torch(platform):
    record, logs = submit_and_follow(platform, EXAMPLES / "digits-torch-cnn", "--epochs", "3")
    assert "installing the job's packages" not in logs, logs[-2000:]
    result = record["result"]
    assert record["mode"] == "full" and result["framework"] == "torch", record
    assert result["final"]["val_accuracy"] >= 0.85, result


def test_cancel_stops_a_torch_job_and_leaves_no_process(platform):
    cancel_mid_training(platform, EXAMPLES / "digits-torch")
