"""The test-only hold hook (issue 28): TRAINSTACK_TEST_HOLD_FILE in the provider's environment
becomes the job's `--hold-file`, and every worker waits at an epoch end while the file exists.
No Pulumi run, no TensorFlow (frameworks.base.EpochHold is plain Python; tests/training runs it
for real).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from trainstack_training.config import TrainConfig, parse_args
from trainstack_training.frameworks import base
from trainstack_training.frameworks.base import EpochHold

from infra.components import training
from infra.components.training import TEST_HOLD_FILE_ENV, _job_command, _TrainingJobProvider
from infra.jobs.launch import LaunchSettings
from tests.support.fakes import SubmittingNode

pytestmark = pytest.mark.unit

HOLD = "/srv/trainstack/models/.test-hold"
RUN_DIR = "/srv/trainstack/models/run-abc"
SETTINGS = {
    "workers": 2,
    "epochs": 8,
    "batch_size": 32,
    "data": "digits",
    "rows": 0,
    "spark_conf": "",
    "strategy": "multi-worker",
    "cores_per_worker": 1,
}


# --- the provider: the environment variable becomes the flag ---------------------------------


def _props(tmp_path: Path) -> dict:
    return {
        "master_url": "spark://control-1:7077,control-2:7077",
        "submit_candidates": ["ts-worker-1"],
        "settings": SETTINGS,
        "run_id": "run-abc",
        "host_artifacts_dir": str(tmp_path),
        "monitoring_url": "",
        "node_cpus": {},
        "scrape_interval": "15s",
        "result": None,
    }


def _command(tmp_path: Path, hold_file: str = "") -> list[str]:
    """The declared job's command for `_props` (infra.jobs.launch, the one builder)."""
    props = _props(tmp_path)
    settings = LaunchSettings.declared(props["settings"], props["master_url"])
    return _job_command(settings, RUN_DIR, hold_file)


def _launch(monkeypatch, tmp_path: Path) -> tuple[dict, SubmittingNode]:
    node = SubmittingNode(RUN_DIR)
    monkeypatch.setattr(training, "_candidates", lambda props: [node])
    result = _TrainingJobProvider()._run(_props(tmp_path))
    return result, node


def test_the_variable_is_the_documented_name():
    assert TEST_HOLD_FILE_ENV == "TRAINSTACK_TEST_HOLD_FILE"


def test_no_variable_no_hold_flag(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv(TEST_HOLD_FILE_ENV, raising=False)
    result, node = _launch(monkeypatch, tmp_path)
    (command,) = node.streamed
    assert "--hold-file" not in command
    assert command == _command(tmp_path)
    assert result["result"]["ok"]
    assert "TEST ONLY" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_variable_is_unset(monkeypatch, tmp_path, value):
    monkeypatch.setenv(TEST_HOLD_FILE_ENV, value)
    _, node = _launch(monkeypatch, tmp_path)
    assert "--hold-file" not in node.streamed[0]


def test_the_variable_is_read_at_launch_and_passed_last(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(TEST_HOLD_FILE_ENV, f" {HOLD} ")
    result, node = _launch(monkeypatch, tmp_path)
    (command,) = node.streamed
    assert command[-2:] == ["--hold-file", HOLD]
    assert command[:-2] == _command(tmp_path)  # nothing else changes
    err = capsys.readouterr().err
    assert f"TEST ONLY: {TEST_HOLD_FILE_ENV} is set" in err and HOLD in err
    assert f"--hold-file {HOLD}" in err  # in the `launching on` line
    # Not an input or an output of the resource: the state never holds it.
    assert HOLD not in json.dumps(result)


def test_setting_or_unsetting_the_variable_changes_no_diff(monkeypatch, tmp_path):
    props = _props(tmp_path)
    provider = _TrainingJobProvider()
    monkeypatch.delenv(TEST_HOLD_FILE_ENV, raising=False)
    assert not provider.diff("run-abc", props, props).changes
    monkeypatch.setenv(TEST_HOLD_FILE_ENV, HOLD)
    assert not provider.diff("run-abc", props, props).changes


def test_an_earlier_launch_with_the_hold_flag_is_still_found(monkeypatch, tmp_path):
    # _stop_earlier_launches matches `--output <run dir>` followed by a space or the end.
    node = SubmittingNode(RUN_DIR, pids=b"42\n")
    training._stop_earlier_launches([node], RUN_DIR, grace_s=0)
    pattern = node.ran[0][2]
    command = " ".join(_command(tmp_path, HOLD))
    assert re.search(pattern, command), (pattern, command)
    assert not re.search(pattern, command.replace(RUN_DIR, RUN_DIR + "x"))


# --- the job: the flag and the hold -------------------------------------------------------------


def test_the_flag_is_a_test_only_config_field():
    assert TrainConfig().hold_file == ""
    assert parse_args(["--hold-file", HOLD]).hold_file == HOLD
    help_text = next(f for f in TrainConfig.__dataclass_fields__.values() if f.name == "hold_file")
    assert help_text.metadata["help"].startswith("TEST ONLY")


class _Clock:
    """A fake monotonic clock that sleeping advances; the file goes away at `release_at`."""

    def __init__(self, path: Path, release_at: float | None) -> None:
        self.now, self.path, self.release_at = 0.0, path, release_at
        self.sleeps = 0

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.release_at is not None and self.now >= self.release_at:
            self.path.unlink(missing_ok=True)

    def __call__(self) -> float:
        return self.now


def _hold(path: Path, clock: _Clock, said: list[str], epochs: int = 8, **kw) -> EpochHold:
    return EpochHold(
        str(path), epochs, 1, 2, poll=0.2, sleep=clock.sleep, clock=clock, say=said.append, **kw
    )


def test_no_file_no_hold_and_no_output(tmp_path):
    clock, said = _Clock(tmp_path / "hold", None), list[str]()
    hold = _hold(tmp_path / "hold", clock, said)
    assert [hold.after_epoch(e) for e in range(1, 9)] == [0.0] * 8
    assert said == [] and clock.sleeps == 0


def test_holds_while_the_file_exists_then_goes_on(tmp_path):
    path = tmp_path / "hold"
    path.touch()
    clock, said = _Clock(path, release_at=3.0), list[str]()
    hold = _hold(path, clock, said)
    assert hold.after_epoch(2) == pytest.approx(3.0)
    assert said[0].startswith(f"holding after epoch 2 while {path} exists (")
    assert "worker 1, attempt 2, pid " in said[0]
    assert said[1] == "hold released after epoch 2 after 3.0 s (worker 1)"
    assert clock.sleeps == 15  # every 0.2 s
    assert hold.after_epoch(3) == 0.0 and len(said) == 2  # the file is gone: no more output


def test_never_holds_after_the_last_epoch(tmp_path):
    path = tmp_path / "hold"
    path.touch()
    clock, said = _Clock(path, release_at=None), list[str]()
    hold = _hold(path, clock, said, epochs=3)
    assert hold.after_epoch(3) == 0.0 and hold.after_epoch(4) == 0.0
    assert said == [] and path.exists()


def test_a_forgotten_file_holds_once_for_the_limit_then_never_again(tmp_path):
    path = tmp_path / "hold"
    path.touch()
    clock, said = _Clock(path, release_at=None), list[str]()
    hold = _hold(path, clock, said, limit=10.0)
    assert 10.0 <= hold.after_epoch(1) < 10.5  # one poll at most past the limit
    assert said[-1].startswith(f"WARNING: {path} still exists after 10 s of hold after epoch 1")
    assert "holding no more in this attempt" in said[-1]
    assert hold.after_epoch(2) == 0.0 and len(said) == 2 and path.exists()


def test_an_unreadable_path_does_not_fail_the_run(tmp_path):
    clock, said = _Clock(tmp_path, None), list[str]()
    hold = _hold(tmp_path / "not-a-dir" / "\0bad", clock, said)  # os.stat raises ValueError
    assert hold.after_epoch(1) == 0.0 and said == []


def test_a_real_file_removed_by_another_thread_releases_the_hold(tmp_path, capsys):
    path = tmp_path / "hold"
    path.touch()
    threading.Timer(0.5, path.unlink).start()
    held = EpochHold(str(path), 5, 0, 1, poll=0.05).after_epoch(1)
    assert 0.4 < held < 5
    out = capsys.readouterr().out  # print()ed, flushed: the worker's log
    assert f"holding after epoch 1 while {path} exists" in out
    assert "hold released after epoch 1" in out


def test_defaults_are_a_fifth_of_a_second_and_fifteen_minutes():
    assert base.HOLD_POLL_SECONDS == 0.2 and base.HOLD_LIMIT_SECONDS == 900.0
    hold = EpochHold(HOLD, 8)
    assert (hold.poll, hold.limit, hold.active) == (0.2, 900.0, True)
    assert EpochHold("", 8).active is False


def test_the_training_module_imports_no_tensorflow():
    # TensorFlow may only be imported after TF_CONFIG is set (train.configure_environment).
    code = (
        "import sys, trainstack_training.train; "
        "print('tensorflow' in sys.modules or 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
