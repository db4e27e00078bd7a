"""A launch of a run directory (attempts.py's launch.json, written by launcher._prepare_run):
a fresh start drops the earlier launch's epochs and result and stamps a new launch; a start
that resumes from a backup keeps them (the tracking sync keys its MLflow run on the stamp)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from trainstack_training.attempts import launched_at
from trainstack_training.config import TrainConfig
from trainstack_training.launcher import _prepare_run

pytestmark = pytest.mark.unit

DIGITS = Path(__file__).resolve().parents[2] / "examples" / "digits"


def _earlier_launch(out: Path) -> float:
    out.mkdir(exist_ok=True)
    (out / "launch.json").write_text('{"launched_at": 1780000000.0}')
    (out / "epochs.jsonl").write_text('{"epoch": 1, "loss": 1.0}\n')
    (out / "metrics.json").write_text('{"final": {"loss": 1.0}}')
    return 1780000000.0


def _prepare(out: Path) -> None:
    _prepare_run(TrainConfig(output=str(out), master="local[2]", job_dir=str(DIGITS)))


def test_a_fresh_start_is_a_new_launch_without_the_earlier_epochs_and_result(tmp_path):
    earlier = _earlier_launch(tmp_path / "run")
    before = time.time()
    _prepare(tmp_path / "run")
    assert not (tmp_path / "run" / "epochs.jsonl").exists()
    assert not (tmp_path / "run" / "metrics.json").exists()
    stamp = launched_at(tmp_path / "run")
    assert stamp is not None and stamp != earlier and stamp >= before - 0.01


def test_a_resumed_start_keeps_its_launch_and_epochs(tmp_path):
    earlier = _earlier_launch(tmp_path / "run")
    (tmp_path / "run" / "backup").mkdir()
    (tmp_path / "run" / "backup" / "chief.weights").write_bytes(b"w")
    _prepare(tmp_path / "run")
    assert (tmp_path / "run" / "epochs.jsonl").read_text().startswith('{"epoch": 1')
    assert launched_at(tmp_path / "run") == earlier


def test_a_run_from_before_launch_stamps_has_none(tmp_path):
    assert launched_at(tmp_path) is None


def test_a_launch_that_fails_records_its_error_and_the_next_launch_drops_it(tmp_path, capsys):
    from trainstack_training.cli import main

    job = tmp_path / "job"
    job.mkdir()
    (job / "trainstack.toml").write_text('[job]\nentry = "nowhere"\n')  # no nowhere.py
    out = tmp_path / "run"
    code = main(["--output", str(out), "--job-dir", str(job), "--master", "local[2]"])
    assert code == 2, capsys.readouterr()
    failed = json.loads((out / "failed.json").read_text())
    assert "nowhere" in failed["error"] and failed["exit"] == 2, failed
    assert failed["kind"] == "JobError" and failed["ended_at"] > 0
    assert launched_at(out) is not None  # the failed launch is a launch
    _prepare(out)
    assert not (out / "failed.json").exists()
