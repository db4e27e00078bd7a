"""One job record for every run (issue 49): the tracking sync reads a run from its job.json,
a submitted job's and the stack's declared job's alike; a declared run from before declared
jobs had a record is read into the same record once (tracking.runfiles.earlier_record)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainstack_training.attempts import record_failure, record_launch
from trainstack_training.rundir import METRICS_FILE, RECORD, read_json, write_json
from trainstack_training.tracking import RunFiles

pytestmark = pytest.mark.unit

RECORD_OF = {
    "id": "run-abc", "origin": "stack", "state": "running", "submitted_at": 10.0,
    "started_at": 11.0, "job": "/jobs/digits", "code_sha": "c" * 64, "env_sha": "",
    "params": {"dropout": 0.2}, "mode": "simple", "framework": "torch", "workers": 2,
    "epochs": 3, "batch_size": 32, "strategy": "multi-worker", "data": "digits",
    "experiment": "", "stack": "trainstack-dev",
}  # fmt: skip


def test_the_declared_jobs_run_is_read_from_its_record(tmp_path: Path) -> None:
    run = tmp_path / "run-abc"
    run.mkdir()
    write_json(run / RECORD, RECORD_OF)
    record_launch(run, fresh=True)
    files = RunFiles.read(run)
    assert (files.job_id, files.state, files.framework()) == ("run-abc", "running", "torch")
    assert files.launch == f"{read_json(run / 'launch.json')['launched_at']:.3f}"
    assert files.params() == {
        "dropout": "0.2", "workers": "2", "epochs": "3", "batch_size": "32",
        "strategy": "multi-worker", "data": "digits", "framework": "torch",
    }  # fmt: skip
    assert files.experiment("other") == "trainstack-dev"
    assert files.start_ms() == 11000


def test_a_submitted_jobs_run_has_no_launch_tag(tmp_path: Path) -> None:
    run = tmp_path / "job-1"
    run.mkdir()
    write_json(run / RECORD, {**RECORD_OF, "id": "job-1", "origin": "submit"})
    record_launch(run, fresh=True)
    assert RunFiles.read(run).launch == ""
    write_json(run / RECORD, {k: v for k, v in RECORD_OF.items() if k != "origin"})
    assert RunFiles.read(run).launch == ""  # a record from before `origin`: a submitted job's


def test_a_declared_run_from_before_its_record_reads_the_same(tmp_path: Path) -> None:
    run = tmp_path / "run-old"
    run.mkdir()
    record_launch(run, fresh=True)
    config = {"workers": 2, "epochs": 3, "batch_size": 32, "train_strategy": "multi-worker",
              "data": "digits", "job_dir": "/srv/trainstack/models/jobs/" + "c" * 64,
              "job_params": '{"dropout": 0.2}'}  # fmt: skip
    (run / METRICS_FILE).write_text(json.dumps({"config": config, "framework": "torch"}))
    files = RunFiles.read(run)
    assert (files.job_id, files.state, files.code_sha()) == ("run-old", "succeeded", "c" * 64)
    assert files.record["origin"] == "stack" and files.launch
    assert files.params()["dropout"] == "0.2" and files.framework() == "torch"
    (run / METRICS_FILE).unlink()
    record_failure(run, "the data set is missing", "NoDataError", 1)
    assert (RunFiles.read(run).state, RunFiles.read(run).error) == (
        "failed",
        "the data set is missing",
    )


def test_a_declared_launch_is_not_synced_before_its_driver_stamped_it(tmp_path: Path) -> None:
    """The stack's job launched again in its directory gets a new record; the launch.json there
    is the earlier launch's until the new driver stamps it (resumed: the same stamp, so the
    same MLflow run; fresh: a new one). Until then the sync leaves the run alone, so an
    earlier launch's finished run is never reopened."""
    from trainstack_training.tracking.sync import sync_run

    run = tmp_path / "run-abc"
    run.mkdir()
    write_json(run / RECORD, {**RECORD_OF, "submitted_at": 10.0})
    record_launch(run, fresh=True)
    first = RunFiles.read(run).launch
    assert RunFiles.read(run).launched and first
    write_json(run / RECORD, {**RECORD_OF, "submitted_at": 20.0, "state": "queued"})
    assert not RunFiles.read(run).launched

    class NoServer:
        def __getattr__(self, name: str):
            raise AssertionError(f"the sync asked the server ({name}) for a pending launch")

    done = sync_run(run, NoServer())  # type: ignore[arg-type]
    assert (done.skipped, done.status, done.run_id) == (True, "PENDING", "")
    record_launch(run, fresh=False)  # resumed from its backup: the same MLflow run goes on
    assert RunFiles.read(run).launched and RunFiles.read(run).launch == first
    write_json(run / RECORD, {**RECORD_OF, "submitted_at": 30.0})
    record_launch(run, fresh=True)  # started afresh: a run of its own
    assert RunFiles.read(run).launched and RunFiles.read(run).launch != first
