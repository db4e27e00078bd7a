"""PyTorch jobs through `trainstack submit` on the shared stack (docs/jobs.md, "PyTorch
jobs"): the first torch job installs torch into the packages overlay (once per cluster),
trains the digits with trainstack's DDP loop on two ranks (gloo) in the warm runner; a
full-mode torch job reuses the overlay; a cancelled torch job leaves no process."""

from __future__ import annotations

import pytest

from .cli import EXAMPLES, cancel_mid_training, submit_and_follow
from .conftest import sh

pytestmark = pytest.mark.e2e


def test_the_torch_digits_example_trains_on_the_cluster(platform):
    record, logs = submit_and_follow(
        platform, EXAMPLES / "digits-torch", "--epochs", "10", timeout=900
    )
    result = record["result"]
    assert result["framework"] == "torch" and result["workers"] == 2, result
    assert result["final_val_accuracy"] >= 0.93, result
    assert set(result["final"]) == {"loss", "accuracy", "val_loss", "val_accuracy"}, result
    run_dir = f"/srv/trainstack/models/{record['id']}"
    container = platform.container("control-3")
    assert sh(container, f"test -s {run_dir}/model.pt && test -s {run_dir}/model.pt2")[0] == 0
    print(f"first torch job: {result['total_seconds']:.1f} s of job; logs:\n{logs[-1500:]}")


def test_a_full_mode_torch_job_reuses_the_installed_torch(platform):
    record, logs = submit_and_follow(platform, EXAMPLES / "digits-torch-cnn", "--epochs", "3")
    assert "installing the job's packages" not in logs, logs[-2000:]
    result = record["result"]
    assert record["mode"] == "full" and result["framework"] == "torch", record
    assert result["final"]["val_accuracy"] >= 0.85, result


def test_cancel_stops_a_torch_job_and_leaves_no_process(platform):
    cancel_mid_training(platform, EXAMPLES / "digits-torch")
