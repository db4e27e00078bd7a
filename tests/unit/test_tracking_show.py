"""What `trainstack status`, `list --metric` and `sync` show of tracking (infra.jobs), from the
records alone: no MLflow call."""

from __future__ import annotations

from pathlib import Path

import pytest
from trainstack_training.manifest import JobError, load_spec

from infra.jobs.cli import sync
from infra.jobs.commands import Jobs
from infra.jobs.show import print_list, print_status

pytestmark = pytest.mark.unit

BASE = {
    "id": "job-20261205-000001-aaaa", "state": "succeeded", "code_sha": "a" * 64, "job": "/j",
    "params": {}, "mode": "simple", "submitted_at": 1.0, "ended_at": 9.0,
}  # fmt: skip
RESULT = {"final": {"val_loss": 0.2345, "val_accuracy": 0.95}, "epochs": 5, "model_path": "m"}


def test_status_shows_the_run_and_its_url(capsys: pytest.CaptureFixture[str]) -> None:
    url = "http://127.0.0.1:5001/#/experiments/1/runs/abc123"
    print_status({**BASE, "tracking": {"run_id": "abc123", "url": url, "complete": True}})
    assert f"  mlflow run abc123 {url}" in capsys.readouterr().out
    print_status({**BASE, "tracking": {"run_id": "abc123", "url": "", "complete": False}})
    assert "mlflow run abc123 (not complete yet: `trainstack sync`)" in capsys.readouterr().out


def test_status_without_tracking_says_nothing_of_it(capsys: pytest.CaptureFixture[str]) -> None:
    print_status(BASE)
    assert "mlflow" not in capsys.readouterr().out


def test_list_with_a_metric_column(capsys: pytest.CaptureFixture[str]) -> None:
    running = {**BASE, "id": "job-20261205-000002-bbbb", "state": "running", "heartbeat": 9e12}
    print_list([{**BASE, "result": RESULT}, running], "val_loss")
    header, done, other = capsys.readouterr().out.splitlines()
    assert "VAL_LOSS" in header and "0.2345" in done
    assert other.split()[4] == "-"
    print_list([{**BASE, "result": RESULT}])
    assert "VAL_LOSS" not in capsys.readouterr().out


def test_list_shows_each_jobs_slots_and_the_free_ones(capsys: pytest.CaptureFixture[str]) -> None:
    beat = {"heartbeat": 9e12}
    running = {**BASE, "id": "job-a", "state": "running", "slots": 1, "workers": 1, **beat}
    waiting = {**BASE, "id": "job-b", "state": "queued", "workers": 2, **beat}
    print_list([{**BASE, "result": RESULT}, running, waiting], capacity=2)
    header, done, one, two, free = capsys.readouterr().out.splitlines()
    assert header.split()[4] == "SLOTS"
    assert [line.split()[3] for line in (done, one, two)] == ["-", "1", "(2)"]
    assert free == "free slots: 1 of 2"


def test_sync_with_tracking_off_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    jobs = Jobs({"jobDefaults": {"stack": "dev"}, "jobNodes": []})
    assert sync(jobs, "") == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["tracking is off on this stack (trainstack:tracking): nothing to sync"]


def test_the_manifest_names_an_experiment(tmp_path: Path) -> None:
    (tmp_path / "model.py").write_text("def build_model(ctx):\n    pass\n")
    (tmp_path / "trainstack.toml").write_text('[job]\nentry = "model"\nexperiment = "sweep"\n')
    assert load_spec(tmp_path).experiment == "sweep"
    (tmp_path / "trainstack.toml").write_text('[job]\nentry = "model"\nexperiment = " "\n')
    with pytest.raises(JobError, match="experiment"):
        load_spec(tmp_path)
