"""The sweep's driver (trainstack_training.sweep) against trials whose jobs are small fake
queue processes (no Spark): each writes its record and epoch rows as the real queue process
and driver do (rundir.py), and ends `pruned` or `cancelled` on SIGTERM as the queue process
does. The real trials on the shared stack: tests/platform/test_81_sweep.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from trainstack_training.rundir import (
    OUTPUT,
    RECORD,
    STUDY_JOURNAL,
    SWEEP_RECORD,
    TRIALS_FILE,
    read_json,
)
from trainstack_training.sweep import driver as driver_module
from trainstack_training.sweep import space, trialjob
from trainstack_training.sweep.trialjob import ID_TOKEN, PARAMS_TOKEN, RUN_DIR_TOKEN

pytestmark = pytest.mark.training

FAKE_QUEUE = r"""
import json, os, signal, socket, sys, time
from pathlib import Path
run_dir, params = Path(sys.argv[1]), json.loads(sys.argv[2])
epochs, pause = int(sys.argv[3]), float(sys.argv[4])
record_path = run_dir / "job.json"
def update(**changes):
    record = {**json.loads(record_path.read_text()), **changes}
    tmp = run_dir / ".job.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, record_path)
def on_term(signum, frame):
    stop = run_dir / ".stop.json"
    reason = json.loads(stop.read_text()).get("reason") if stop.exists() else ""
    update(state="pruned" if reason == "pruned" else "cancelled", ended_at=time.time())
    sys.exit(1)
signal.signal(signal.SIGTERM, on_term)
with open(run_dir.parent / "starts.log", "a") as fh:
    fh.write(run_dir.name + "\n")
update(state="running", pid=os.getpid(), host=socket.gethostname(), heartbeat=time.time())
for epoch in range(1, epochs + 1):
    time.sleep(pause)
    score = float(params["x"]) * epoch / epochs
    with open(run_dir / "epochs.jsonl", "a") as fh:
        fh.write(json.dumps({"epoch": epoch, "val_score": score, "loss": 1 - score}) + "\n")
    update(heartbeat=time.time())
update(state="succeeded", ended_at=time.time())
"""


def make_sweep(
    tmp_path: Path, definition: dict[str, Any], epochs: int = 4, pause: float = 0.05
) -> Path:
    """A models dir with one sweep whose template runs the fake queue process."""
    models = tmp_path / "models"
    sweep_dir = models / "sweeps" / "sweep-test"
    sweep_dir.mkdir(parents=True)
    fake = tmp_path / "fake_queue.py"
    fake.write_text(FAKE_QUEUE)
    spec = space.parse_sweep(definition, {"x": 0.5, "other": 1}, "trainstack.toml")
    command = [sys.executable, str(fake), RUN_DIR_TOKEN, PARAMS_TOKEN, str(epochs), str(pause)]
    record = {
        "id": "sweep-test",
        "state": "starting",
        "submitted_at": time.time(),
        "params": {"x": 0.5, "other": 1},
        "definition": spec.to_dict(),
        "template": {
            "record": {
                "id": ID_TOKEN,
                "framework": "tensorflow",
                "origin": "sweep",
                "epochs": epochs,
            },
            "command": command,
            "install": "",
        },
    }
    (sweep_dir / SWEEP_RECORD).write_text(json.dumps(record))
    return sweep_dir


def sweep_table(**more: Any) -> dict[str, Any]:
    return {
        "metric": "val_score",
        "goal": "max",
        "method": "random",
        "seed": 3,
        "params": {"x": {"distribution": "uniform", "low": 0.0, "high": 1.0}},
        **more,
    }


def trial_records(sweep_dir: Path) -> list[dict[str, Any]]:
    models = sweep_dir.parent.parent
    return [read_json(p / RECORD) for p in sorted(models.glob("sweep-test-t*"))]


def test_trials_run_as_jobs_and_the_best_is_the_highest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_module, "POLL_SECONDS", 0.05)
    sweep_dir = make_sweep(tmp_path, sweep_table(trials=5, parallel=2))
    assert driver_module.main([str(sweep_dir)]) == 0
    record = read_json(sweep_dir / SWEEP_RECORD)
    assert record["state"] == "succeeded", record
    jobs = trial_records(sweep_dir)
    assert [j["id"] for j in jobs] == [f"sweep-test-t{n:03d}" for n in range(5)]
    assert all(j["state"] == "succeeded" for j in jobs), jobs
    # Each trial's job has the job's params with the trial's value over them.
    assert all(j["params"]["other"] == 1 and j["sweep"] == "sweep-test" for j in jobs)
    table = read_json(sweep_dir / TRIALS_FILE)
    values = {t["job_id"]: t["value"] for t in table["trials"]}
    for job in jobs:  # the last epoch's score: x itself
        assert values[job["id"]] == pytest.approx(job["params"]["x"])
    best = max(values, key=lambda k: values[k])
    assert table["best"]["job_id"] == best
    assert table["best"]["model"].endswith(f"{best}/model.keras")
    assert (sweep_dir / STUDY_JOURNAL).stat().st_size > 0


def test_a_lagging_trial_is_pruned_and_its_job_ends_pruned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One at a time, the median rule after the first trial: a trial whose score at an epoch
    # is below the finished trials' median there is stopped (the driver looks every 30 ms,
    # an epoch takes 100).
    monkeypatch.setattr(driver_module, "POLL_SECONDS", 0.03)
    definition = sweep_table(trials=5, parallel=1, early_stop="median", min_epochs=1, seed=11)
    sweep_dir = make_sweep(tmp_path, definition, epochs=4, pause=0.1)
    assert driver_module.main([str(sweep_dir)]) == 0
    table = read_json(sweep_dir / TRIALS_FILE)
    pruned = [t for t in table["trials"] if t["state"] == "pruned"]
    assert pruned, table["trials"]
    jobs = {j["id"]: j for j in trial_records(sweep_dir)}
    for trial in pruned:
        job = jobs[trial["job_id"]]
        assert job["state"] == "pruned", job
        assert trial["epochs"] < 4, trial
        assert not _alive(int(job["pid"])), job
    finished = [t["value"] for t in table["trials"] if t["state"] == "succeeded"]
    assert table["best"]["value"] == max(finished)
    output = (sweep_dir / OUTPUT).read_text()
    assert "pruned at epoch" in output, output


def test_a_metric_the_job_does_not_report_fails_the_sweep_in_one_sentence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(driver_module, "POLL_SECONDS", 0.05)
    definition = sweep_table(metric="val_acc", trials=3, parallel=1)
    sweep_dir = make_sweep(tmp_path, definition, epochs=50, pause=0.1)
    assert driver_module.main([str(sweep_dir)]) == 1
    record = read_json(sweep_dir / SWEEP_RECORD)
    assert record["state"] == "failed"
    assert record["error"] == (
        "metric 'val_acc': trial 0's epoch 1 has no such metric; the job reports loss, "
        "val_score ([sweep] metric)"
    )
    assert [j["state"] for j in trial_records(sweep_dir)] == ["cancelled"]


def test_a_killed_driver_resumed_runs_no_trial_twice(tmp_path: Path) -> None:
    sweep_dir = make_sweep(tmp_path, sweep_table(trials=5, parallel=2), epochs=4, pause=0.15)
    first = _driver(sweep_dir)
    _wait(lambda: len(trial_records(sweep_dir)) >= 3, 30)
    first.kill()
    first.wait()
    again = _driver(sweep_dir)
    assert again.wait(timeout=60) == 0
    starts = (sweep_dir.parent.parent / "starts.log").read_text().split()
    assert sorted(starts) == [f"sweep-test-t{n:03d}" for n in range(5)], starts
    assert read_json(sweep_dir / SWEEP_RECORD)["state"] == "succeeded"
    assert "followed again" in (sweep_dir / OUTPUT).read_text()


def test_a_trial_lost_with_its_node_runs_its_params_once_more(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trialjob, "STALE_SECONDS", 1.0)
    sweep_dir = make_sweep(tmp_path, sweep_table(trials=2, parallel=2), epochs=40, pause=0.2)
    first = _driver(sweep_dir)
    _wait(lambda: sum(bool(r.get("pid")) for r in trial_records(sweep_dir)) == 2, 30)
    first.kill()
    first.wait()
    lost = trial_records(sweep_dir)[0]
    os.kill(int(lost["pid"]), signal.SIGKILL)  # its node gone: no end recorded
    time.sleep(1.5)
    other = trial_records(sweep_dir)[1]
    os.kill(int(other["pid"]), signal.SIGTERM)  # ends cancelled: not lost
    driver = driver_module.Driver(sweep_dir)
    driver.study = driver.open_study()
    driver.recover()
    output = (sweep_dir / OUTPUT).read_text()
    assert f"trial 0 (job {lost['id']}) lost its queue process" in output, output
    assert driver.counted() == 1  # the lost trial does not count toward `trials`
    trial = driver.study.ask(space.distributions(driver.spec))
    assert trial.params == {"x": lost["params"]["x"]}  # its params, once more
    assert trial.user_attrs[driver_module.RERUN_ATTR] == 0


def test_cancel_stops_every_running_trial(tmp_path: Path) -> None:
    sweep_dir = make_sweep(tmp_path, sweep_table(trials=4, parallel=2), epochs=100, pause=0.2)
    proc = _driver(sweep_dir)
    _wait(lambda: sum(bool(r.get("pid")) for r in trial_records(sweep_dir)) == 2, 30)
    (sweep_dir / ".stop.json").write_text(json.dumps({"reason": "cancelled"}))
    assert proc.wait(timeout=30) == 1
    assert read_json(sweep_dir / SWEEP_RECORD)["state"] == "cancelled"
    jobs = trial_records(sweep_dir)
    assert [j["state"] for j in jobs] == ["cancelled", "cancelled"], jobs
    assert not any(_alive(int(j["pid"])) for j in jobs)


def _driver(sweep_dir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainstack_training.sweep", str(sweep_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout} s")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie (not reaped yet) has gone
        return fh.read().split(") ", 1)[1][0] != "Z"


@pytest.mark.parametrize("method", ["grid", "random"])
def test_a_resumed_seeded_study_asks_no_point_twice(tmp_path: Path, method: str) -> None:
    """A driver started again opens the same study: a grid goes on through its points (its
    seed orders them: the same seed), a random search is seeded past the draws it made."""
    table = sweep_table(method=method, seed=10, trials=4, parallel=2)
    table["params"] = {"x": {"distribution": "choice", "values": [0.1, 0.2, 0.3, 0.4]}}
    if method == "random":
        table["params"] = {"x": {"distribution": "uniform", "low": 0.0, "high": 1.0}}
    sweep_dir = make_sweep(tmp_path, table)
    asked = []
    for _ in range(2):  # two drivers, one after the other, two asks each
        driver = driver_module.Driver(sweep_dir)
        driver.study = driver.open_study()
        asked += [driver.study.ask(space.distributions(driver.spec)).params["x"] for _ in (0, 1)]
    assert len(set(asked)) == 4, asked
