"""A sweep's MLflow parent run (trainstack_training.tracking.sweeps, issue 50), without a
server: what a pass sends is decided from the files alone (nothing changed: no request), a
trial of a missing sweep is a plain run, and the race to make the parent leaves one. The real
server's side is tests/training/test_tracking_sync.py's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from trainstack_training.rundir import (
    RECORD,
    SWEEP_RECORD,
    SWEEPS_DIR,
    TRACKING_FILE,
    TRIALS_FILE,
    read_json,
    write_json,
)
from trainstack_training.tracking import RunFiles, SweepFiles, run_dirs, sweep_dirs
from trainstack_training.tracking.sweeps import (
    PARENT_TAG,
    changes,
    child_tags,
    make_parent,
    sync_sweep,
)

pytestmark = pytest.mark.unit

SWEEP_ID = "sweep-20261205-000001-abcd"


class NoServer:
    """A client the code under test must not use."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"asked the server ({name})")


def sweep_dir(models: Path, state: str = "running", **more: Any) -> Path:
    where = models / SWEEPS_DIR / SWEEP_ID
    where.mkdir(parents=True, exist_ok=True)
    record = {
        "id": SWEEP_ID, "state": state, "submitted_at": 100.0, "experiment": "", "stack": "dev",
        "job": "/home/u/digits", "describe": {"method": "tpe", "metric": "val_accuracy"}, **more,
    }  # fmt: skip
    write_json(where / SWEEP_RECORD, record)
    return where


def trials(where: Path, rows: list[tuple[int, str, float | None]], best: int | None) -> None:
    table = [
        {"number": n, "job_id": f"{SWEEP_ID}-t{n:03d}", "params": {}, "state": state,
         "value": value, "epochs": 2}
        for n, state, value in rows
    ]  # fmt: skip
    chosen = next((r for r in table if r["number"] == best), None)
    write_json(
        where / TRIALS_FILE,
        {"metric": "val_accuracy", "goal": "max", "trials": table, "updated_at": 500.0,
         "best": chosen and {k: chosen[k] for k in ("number", "job_id", "value", "params")}},
    )  # fmt: skip


def trial_run(models: Path, number: int, state: str = "succeeded", run_id: str = "",
              complete: bool = True, sweep: str = SWEEP_ID) -> Path:  # fmt: skip
    run = models / f"{SWEEP_ID}-t{number:03d}"
    run.mkdir(parents=True, exist_ok=True)
    record = {"id": run.name, "state": state, "sweep": sweep, "trial": number, "ended_at": 200.0}
    write_json(run / RECORD, {**record, "stack": "dev"})
    if run_id:
        write_json(run / TRACKING_FILE, {"run_id": run_id, "complete": complete})
    return run


def test_the_sweeps_dir_is_no_run_and_is_a_sweep(tmp_path: Path) -> None:
    sweep_dir(tmp_path)
    (tmp_path / SWEEPS_DIR / RECORD).write_text("{}")  # even with a record in it
    trial_run(tmp_path, 0)
    assert [p.name for p in run_dirs(tmp_path)] == [f"{SWEEP_ID}-t000"]
    assert sweep_dirs(tmp_path) == [tmp_path / SWEEPS_DIR / SWEEP_ID]
    assert sweep_dirs(tmp_path / "nothing-here") == []


def test_the_best_value_is_sent_when_it_changes_and_tags_follow_the_best_trial(
    tmp_path: Path,
) -> None:
    where = sweep_dir(tmp_path)
    trial_run(tmp_path, 0, run_id="r0")
    trials(where, [(0, "succeeded", 0.7), (1, "running", None)], best=0)
    first = changes(SweepFiles.read(where), {"status": "RUNNING"})
    assert first.metric == ("best_val_accuracy", 0.7, 200_000, 1)
    assert (first.best_trial, first.best_run, first.was_best) == (f"{SWEEP_ID}-t000", "r0", "")
    assert first.status == "RUNNING" and not first.end
    sent = {"status": "RUNNING", "best": first.best}
    assert not changes(SweepFiles.read(where), sent)  # nothing new: nothing to send

    # A better trial, not synced yet: the value and the parent's tag now, the run's later.
    trials(where, [(0, "succeeded", 0.7), (1, "pruned", 0.5), (2, "succeeded", 0.9)], best=2)
    trial_run(tmp_path, 2)
    second = changes(SweepFiles.read(where), sent)
    assert second.metric is not None and second.metric[1:2] + second.metric[3:] == (0.9, 3)
    assert second.best_trial == f"{SWEEP_ID}-t002" and not second.best_run
    assert second.best["run_id"] == "r0"  # still the tagged one
    sent["best"] = second.best
    write_json(tmp_path / f"{SWEEP_ID}-t002" / TRACKING_FILE, {"run_id": "r2", "complete": True})
    third = changes(SweepFiles.read(where), sent)
    assert third.metric is None and not third.best_trial
    assert (third.best_run, third.was_best) == ("r2", "r0")


@pytest.mark.parametrize(("state", "status"), [("succeeded", "FINISHED"), ("failed", "FAILED"),
                                               ("cancelled", "KILLED")])  # fmt: skip
def test_the_parent_ends_once_every_trial_run_is_synced_complete(
    tmp_path: Path, state: str, status: str
) -> None:
    where = sweep_dir(tmp_path, state=state, ended_at=300.0)
    trials(where, [(0, "succeeded", 0.7), (1, "cancelled", None), (2, "failed", None)], best=0)
    trial_run(tmp_path, 0, run_id="r0")
    trial_run(tmp_path, 1, state="cancelled", run_id="r1", complete=False)
    # Trial 2 has no run directory (never started): not waited for.
    sent = {"status": "RUNNING", "best": {"value": 0.7, "job_id": f"{SWEEP_ID}-t000",
                                          "run_id": "r0"}}  # fmt: skip
    assert not changes(SweepFiles.read(where), sent)
    write_json(tmp_path / f"{SWEEP_ID}-t001" / TRACKING_FILE, {"run_id": "r1", "complete": True})
    done = changes(SweepFiles.read(where), sent)
    assert done.end and done.status == status and done.metric is None
    assert not changes(SweepFiles.read(where), {**sent, "status": status})
    sweep_dir(tmp_path, state="running")  # resumed: running again
    again = changes(SweepFiles.read(where), {**sent, "status": status})
    assert again.end and again.status == "RUNNING"


def test_a_trial_of_a_missing_or_unreadable_sweep_is_a_plain_run(tmp_path: Path) -> None:
    run = trial_run(tmp_path, 0)
    assert child_tags(NoServer(), RunFiles.read(run)) == {}  # type: ignore[arg-type]
    where = tmp_path / SWEEPS_DIR / SWEEP_ID
    where.mkdir(parents=True)
    (where / SWEEP_RECORD).write_text('{"id": "sweep-20261205-000001-abcd", "sta')
    assert child_tags(NoServer(), RunFiles.read(run)) == {}  # type: ignore[arg-type]
    other = trial_run(tmp_path, 1, sweep="../../etc")
    assert child_tags(NoServer(), RunFiles.read(other)) == {}  # type: ignore[arg-type]
    plain = tmp_path / "job-20261205-000001-aaaa"
    plain.mkdir()
    write_json(plain / RECORD, {"id": plain.name, "state": "running"})
    assert child_tags(NoServer(), RunFiles.read(plain)) == {}  # type: ignore[arg-type]


def test_a_sweep_with_its_parent_costs_no_request(tmp_path: Path) -> None:
    where = sweep_dir(tmp_path)
    write_json(where / TRACKING_FILE, {"run_id": "p1", "experiment_id": "1", "status": "RUNNING"})
    run = trial_run(tmp_path, 4)
    assert child_tags(NoServer(), RunFiles.read(run)) == {  # type: ignore[arg-type]
        PARENT_TAG: "p1", "trainstack.sweep": SWEEP_ID, "trainstack.trial": "4",
    }  # fmt: skip
    done = sync_sweep(where, NoServer())  # type: ignore[arg-type]
    assert (done.run_id, done.status, done.complete) == ("p1", "RUNNING", False)


class FakeClient:
    """Just what make_parent asks: one experiment, runs by id."""

    def __init__(self) -> None:
        self.runs: dict[str, SimpleNamespace] = {}
        self.deleted: list[str] = []
        self.on_create: Any = None

    def get_experiment_by_name(self, name: str) -> Any:
        return SimpleNamespace(experiment_id="1", lifecycle_stage="active")

    def search_runs(self, ids: list[str], filter_string: str, max_results: int) -> list[Any]:
        return [r for r in self.runs.values() if r.info.run_id not in self.deleted][:max_results]

    def create_run(self, experiment_id: str, start_time: int, tags: dict[str, str],
                   run_name: str) -> Any:  # fmt: skip
        if self.on_create is not None:
            hook, self.on_create = self.on_create, None
            hook()
        run_id = f"run{len(self.runs) + 1}"
        run = SimpleNamespace(
            info=SimpleNamespace(run_id=run_id), data=SimpleNamespace(params={}, tags=dict(tags))
        )
        self.runs[run_id] = run
        return run

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = ()) -> None:
        self.runs[run_id].data.params.update({p.key: p.value for p in params})

    def delete_run(self, run_id: str) -> None:
        self.deleted.append(run_id)


def test_two_syncs_racing_to_make_the_parent_leave_the_first_ones(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    where = sweep_dir(tmp_path)
    client = FakeClient()
    won: list[str] = []
    # Another sync (another node: the lock does not hold there) makes and writes its parent
    # while this one makes its own.
    client.on_create = lambda: won.append(make_parent(client, SweepFiles.read(where), "dev"))  # type: ignore[arg-type]
    mine = make_parent(client, SweepFiles.read(where), "dev")  # type: ignore[arg-type]
    assert won == ["run1"] and mine == "run1"
    assert client.deleted == ["run2"]  # the loser's own
    assert read_json(where / TRACKING_FILE)["run_id"] == "run1"
    assert client.runs["run1"].data.params == {"method": "tpe", "metric": "val_accuracy"}
    # A parent made but not written down (a sync stopped in between) is adopted, not made again.
    (where / TRACKING_FILE).unlink()
    assert make_parent(client, SweepFiles.read(where), "dev") == "run1"  # type: ignore[arg-type]
    assert len(client.runs) == 2
