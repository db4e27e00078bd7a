"""Run directories become MLflow runs (trainstack_training.tracking), against a real `mlflow
server --app-name basic-auth` started here (module-scoped: it takes 15-45 s to start).

"Each epoch once" is counted in what the sync sends (`sent`), not only in what the server
holds: the server keeps one of identical points (key, step, timestamp, value), and the sync's
points are identical each time it sends them (the timestamp is the epoch row's), so a step
sent twice would not show in the run's history."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from trainstack_training import tracking
from trainstack_training.attempts import record_failure, record_launch
from trainstack_training.tracking import (
    JOB_ID_TAG,
    TRACKING_FILE,
    SweepFiles,
    make_client,
    sync_run,
)
from trainstack_training.tracking.sweeps import make_parent

pytestmark = pytest.mark.training

ADMIN, PASSWORD = "trainstack", "a-long-derived-password-1"
START_TIMEOUT = 120.0
METRICS = ("loss", "accuracy", "val_loss", "val_accuracy")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A real MLflow tracking server with basic auth, its stores in a temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root, self.port = root, _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.auth_file = root / "auth.ini"
        self.auth_file.write_text(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{root}/basic_auth.db\n"
            f"admin_username = {ADMIN}\nadmin_password = {PASSWORD}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            "auth_cache_ttl_seconds = 60\n"
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": "test-secret-key",
            "MLFLOW_AUTH_CONFIG_PATH": str(self.auth_file),
            # As the mlflow role runs it: no job runner (GenAI jobs; a process tree of its own).
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        mlflow = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--app-name", "basic-auth", "--workers", "1",
             "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db",
             "--artifacts-destination", str(self.root / "artifacts")],
            env=env, stdout=(self.root / "server.log").open("ab"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                time.sleep(0.5)
        raise AssertionError(f"mlflow server not up in {START_TIMEOUT} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("mlflow"))
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: Server, monkeypatch: pytest.MonkeyPatch) -> Any:
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    made = make_client(server.uri, str(server.auth_file))
    yield made
    for key in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        os.environ.pop(key, None)


class Sent:
    """The metric points the client sent and the server accepted, per run, in order: what the
    sync asked for, before the server drops a point identical to one it has."""

    def __init__(self) -> None:
        self.points: list[tuple[str, Any]] = []  # (run id, mlflow.entities.Metric)

    def record(self, run_id: str, metrics: Iterable[Any]) -> None:
        self.points.extend((run_id, m) for m in metrics)

    def count(self, run_id: str, keys: Iterable[str] = METRICS) -> Counter[tuple[str, int]]:
        """How many times each (key, step) of `keys` was sent to the run."""
        wanted = set(keys)
        return Counter((m.key, m.step) for r, m in self.points if r == run_id and m.key in wanted)

    def each_once(self, run_id: str, steps: Iterable[int], keys: Iterable[str] = METRICS) -> None:
        """Every step of every key sent to the run exactly once, and nothing else of them."""
        keys = tuple(keys)
        expected = Counter({(key, step): 1 for key in keys for step in steps})
        assert self.count(run_id, keys) == expected, sorted(self.count(run_id, keys).items())


@pytest.fixture
def sent(client: Any, monkeypatch: pytest.MonkeyPatch) -> Sent:
    """Count what `client` sends: its log_batch and log_metric (the sync's only ways to log a
    metric), wrapped on this client, each point recorded once its request has succeeded."""
    from mlflow.entities import Metric

    seen = Sent()
    log_batch, log_metric = client.log_batch, client.log_metric

    def counted_batch(run_id: str, metrics: Any = (), *args: Any, **kwargs: Any) -> Any:
        done = log_batch(run_id, metrics, *args, **kwargs)
        seen.record(run_id, metrics or ())
        return done

    def counted_metric(run_id: str, key: str, value: float, timestamp: Any = None,
                       step: Any = None, *args: Any, **kwargs: Any) -> Any:  # fmt: skip
        done = log_metric(run_id, key, value, timestamp, step, *args, **kwargs)
        seen.record(run_id, [Metric(key, value, timestamp or 0, step or 0)])
        return done

    monkeypatch.setattr(client, "log_batch", counted_batch)
    monkeypatch.setattr(client, "log_metric", counted_metric)
    return seen


# -- run directories as the runner, the report and the launcher leave them ----------------


def epoch_row(epoch: int) -> dict[str, Any]:
    return {
        "epoch": epoch, "attempt": 1, "train_seconds": 0.4, "samples": 1437,
        "ended_at": 1_780_000_000.0 + epoch, "loss": 1.0 / epoch, "accuracy": 0.5 + epoch / 20,
        "val_loss": 1.2 / epoch, "val_accuracy": 0.45 + epoch / 20,
    }  # fmt: skip


def make_run(root: Path, job_id: str, *, epochs: int = 5, done: int = 5,
             state: str = "running", error: str = "", experiment: str = "",
             **more: Any) -> Path:  # fmt: skip
    """A submitted job's run directory after `done` of `epochs` epochs (its queue process's
    job.json, epochs.jsonl, output.log; once succeeded the report's metrics.json, curves.png and the
    model). `more`: more fields of its record (a sweep's trial: its sweep and number)."""
    run_dir = root / job_id
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "id": job_id, "state": state, "submitted_at": 1_780_000_000.0,
        "started_at": 1_780_000_000.5, "heartbeat": time.time(), "job": "/home/u/digits",
        "code_sha": "c0de" * 16, "env_sha": "", "params": {"hidden_units": 64, "dropout": 0.2},
        "mode": "simple", "framework": "tensorflow", "node": "worker-1", "epochs": epochs,
        "workers": 2, "data": "digits", "batch_size": 32, "strategy": "multi_worker",
        "stack": "dev", **({"experiment": experiment} if experiment else {}), **more,
    }  # fmt: skip
    if state in ("succeeded", "failed", "cancelled", "pruned"):
        record |= {"ended_at": 1_780_000_100.0, "error": error}
    (run_dir / "job.json").write_text(json.dumps(record))
    rows = [json.dumps(epoch_row(e)) + "\n" for e in range(1, done + 1)]
    (run_dir / "epochs.jsonl").write_text("".join(rows))
    (run_dir / "output.log").write_text(f"[trainstack] epoch 1/{epochs} loss 1.0\n")
    if state == "succeeded":
        (run_dir / "model.keras").write_bytes(b"PK\x03\x04 a keras zip")
        (run_dir / "curves.png").write_bytes(b"\x89PNG\r\n\x1a\n curves")
        metrics = {
            "final": {"loss": 0.2, "val_loss": 0.24, "val_accuracy": 0.95},
            "time_split": {"spark_startup": 3.0, "data": 0.5, "training": 4.0, "other": 0.1},
            "total_seconds": 8.0, "spark_application": "warm-runner",
            "spark_application_id": "app-20261205041200-0003", "framework": "tensorflow",
            "config": {"workers": 2, "epochs": epochs, "batch_size": 32},
        }  # fmt: skip
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
    return run_dir


def the_run(client: Any, job_id: str) -> Any:
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`{JOB_ID_TAG}` = '{job_id}'",
    )
    assert len(runs) == 1, runs
    return runs[0]


def history(client: Any, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


# -- cases -----------------------------------------------------------------------------


def test_the_login_works_and_a_client_without_it_is_refused(server: Server, client: Any) -> None:
    client.search_experiments()  # the admin login: allowed
    request = urllib.request.Request(
        f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=1"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    os.environ.pop("MLFLOW_TRACKING_USERNAME")
    os.environ.pop("MLFLOW_TRACKING_PASSWORD")
    with pytest.raises(MlflowException, match=r"401|[Uu]nauthori"):
        MlflowClient(server.uri).search_experiments()


def test_a_finished_job_becomes_one_complete_run(tmp_path: Path, client: Any, sent: Sent) -> None:
    run_dir = make_run(tmp_path, "job-20261205-000001-aaaa", state="succeeded")
    synced = sync_run(run_dir, client, stack="dev", ui_url="http://127.0.0.1:5001")
    sent.each_once(synced.run_id, range(1, 6))
    sent.each_once(synced.run_id, [0], ["final_val_accuracy", "total_seconds"])
    run = client.get_run(synced.run_id)
    assert run.info.status == "FINISHED" and run.info.end_time == 1_780_000_100_000
    assert run.info.start_time == 1_780_000_000_500
    assert client.get_experiment(run.info.experiment_id).name == "dev"
    assert run.data.params == {
        "hidden_units": "64", "dropout": "0.2", "workers": "2", "epochs": "5",
        "batch_size": "32", "strategy": "multi_worker", "data": "digits",
        "framework": "tensorflow",
    }  # fmt: skip
    tags = run.data.tags
    assert tags[JOB_ID_TAG] == "job-20261205-000001-aaaa"
    assert tags["trainstack.code_sha"] == "c0de" * 16
    assert tags["trainstack.mode"] == "simple" and tags["trainstack.stack"] == "dev"
    assert tags["trainstack.spark_application"] == "app-20261205041200-0003"
    assert tags["trainstack.job_dir"] == run_dir.name
    for key in METRICS:
        assert history(client, synced.run_id, key) == [1, 2, 3, 4, 5]
    assert client.get_metric_history(synced.run_id, "loss")[0].value == 1.0
    assert run.data.metrics["final_val_accuracy"] == 0.95
    assert run.data.metrics["time_training_s"] == 4.0
    listed = {f.path for f in client.list_artifacts(synced.run_id)}
    assert listed == {"model.keras", "curves.png", "metrics.json", "output.log"}
    written = json.loads((run_dir / TRACKING_FILE).read_text())
    assert written["complete"] is True and written["synced_steps"] == [1, 2, 3, 4, 5]
    assert written["url"] == (
        f"http://127.0.0.1:5001/#/experiments/{run.info.experiment_id}/runs/{synced.run_id}"
    )


def test_syncing_twice_changes_nothing(tmp_path: Path, client: Any, sent: Sent) -> None:
    run_dir = make_run(tmp_path, "job-20261205-000002-bbbb", state="succeeded")
    first = sync_run(run_dir, client, stack="dev")
    sent_first = len(sent.points)
    again = sync_run(run_dir, client, stack="dev")
    assert again.run_id == first.run_id
    assert (again.params, again.metrics, again.artifacts) == (0, 0, [])
    assert sent_first and sent.points[sent_first:] == [], sent.points[sent_first:]
    sent.each_once(first.run_id, range(1, 6))
    for key in (*METRICS, "final_val_loss"):
        steps = history(client, first.run_id, key)
        assert len(steps) == len(set(steps)), (key, steps)
    assert len(history(client, first.run_id, "loss")) == 5
    # Unchanged since: skipped without a request.
    skipped = tracking.sync_all([run_dir], client)
    assert skipped[0].skipped


def test_a_job_synced_mid_way_then_complete_has_each_epoch_once(
    tmp_path: Path, client: Any, sent: Sent
) -> None:
    job_id = "job-20261205-000003-cccc"
    run_dir = make_run(tmp_path, job_id, done=2)
    mid = sync_run(run_dir, client, stack="dev")
    sent.each_once(mid.run_id, [1, 2])
    run = client.get_run(mid.run_id)
    assert run.info.status == "RUNNING"
    assert history(client, mid.run_id, "val_loss") == [1, 2]
    assert not client.list_artifacts(mid.run_id)
    assert json.loads((run_dir / TRACKING_FILE).read_text())["complete"] is False
    assert not tracking.up_to_date(run_dir)
    record_launch(run_dir, fresh=True)  # a submitted job is a run from before its launch
    make_run(tmp_path, job_id, done=5, state="succeeded")
    sync_run(run_dir, client, stack="dev")
    sent.each_once(mid.run_id, range(1, 6))  # epochs 1 and 2 not sent again
    for key in METRICS:
        assert history(client, mid.run_id, key) == [1, 2, 3, 4, 5]
    assert client.get_run(mid.run_id).info.status == "FINISHED"
    the_run(client, job_id)  # one run


def test_a_sync_stopped_before_its_record_logs_no_step_twice(
    tmp_path: Path, client: Any, sent: Sent
) -> None:
    """The daemon's rounds trust tracking.json's steps; one that is behind the server (a sync
    stopped between logging and writing it) makes the next round send those steps again, the
    very same points (the epoch row's value and timestamp), of which the server keeps one."""
    job_id = "job-20261205-000008-hhhh"
    run_dir = make_run(tmp_path, job_id, done=3)
    first = sync_run(run_dir, client, stack="dev")
    record = json.loads((run_dir / TRACKING_FILE).read_text())
    assert record["synced_steps"] == [1, 2, 3]
    (run_dir / TRACKING_FILE).write_text(json.dumps({**record, "synced_steps": [1]}))
    make_run(tmp_path, job_id, done=4)
    again = sync_run(run_dir, client, stack="dev")
    assert again.run_id == first.run_id and again.metrics == 3 * len(METRICS), again
    counts = sent.count(first.run_id)
    assert counts == {(k, s): 2 if s in (2, 3) else 1 for k in METRICS for s in (1, 2, 3, 4)}
    points: dict[tuple[str, int], set[tuple[float, int]]] = {}
    for run_id, m in sent.points:
        if run_id == first.run_id:
            points.setdefault((m.key, m.step), set()).add((m.value, m.timestamp))
    assert all(len(same) == 1 for same in points.values()), points  # sent again identical
    for key in METRICS:
        assert history(client, first.run_id, key) == [1, 2, 3, 4], key


def test_a_declared_job_launched_again_in_its_directory_is_a_second_run(
    tmp_path: Path, client: Any, sent: Sent
) -> None:
    """The stack's declared job (no job.json) launched again with the same run id: the launcher
    drops the first launch's epochs and metrics.json and stamps a new launch; its epochs go to
    a run of their own, each once, and the first run keeps its own."""
    run_dir = make_run(tmp_path, "run-0123456789ab", state="succeeded")
    (run_dir / "job.json").unlink()
    result = json.loads((run_dir / "metrics.json").read_text())
    (run_dir / "metrics.json").write_text(json.dumps({**result, "params": {"hidden_units": 128}}))
    record_launch(run_dir, fresh=True)
    first = sync_run(run_dir, client, stack="dev")
    assert client.get_run(first.run_id).info.status == "FINISHED"
    assert client.get_run(first.run_id).data.params["hidden_units"] == "128"
    for name in ("epochs.jsonl", "metrics.json"):  # as launcher._prepare_run does
        (run_dir / name).unlink()
    time.sleep(0.01)
    record_launch(run_dir, fresh=True)
    rows = [json.dumps({**epoch_row(e), "loss": 9.0}) + "\n" for e in (1, 2)]
    (run_dir / "epochs.jsonl").write_text("".join(rows))
    second = sync_run(run_dir, client, stack="dev")
    assert second.run_id != first.run_id and second.status == "RUNNING", second
    assert history(client, second.run_id, "loss") == [1, 2]
    assert history(client, first.run_id, "loss") == [1, 2, 3, 4, 5]
    again = sync_run(run_dir, client, stack="dev")  # a round of the daemon: the same run
    assert again.run_id == second.run_id
    assert [m.value for m in client.get_metric_history(second.run_id, "loss")] == [9.0, 9.0]
    (run_dir / "metrics.json").write_text(json.dumps({"final": {"loss": 9.0}}))
    done = sync_run(run_dir, client, stack="dev")
    assert done.run_id == second.run_id and done.status == "FINISHED", done
    assert history(client, second.run_id, "loss") == [1, 2]
    sent.each_once(first.run_id, range(1, 6))
    sent.each_once(second.run_id, [1, 2])  # over its three syncs


@pytest.mark.parametrize(("exit_code", "status"), [(1, "FAILED"), (130, "KILLED")])
def test_a_declared_job_that_did_not_succeed_is_a_run_that_says_so(
    tmp_path: Path, client: Any, exit_code: int, status: str
) -> None:
    """A declared job's run from before declared jobs had a job.json: its launch's failed.json
    (cli.py) ends its run, with the error (tracking.runfiles.earlier_record)."""
    run_dir = make_run(tmp_path, f"run-{exit_code:012d}", done=2)
    (run_dir / "job.json").unlink()
    assert not tracking.is_run_dir(run_dir)  # running: not a run until it ends
    record_launch(run_dir, fresh=True)
    error = "your code failed: KeyError: 'width' (at net.py:2)"
    record_failure(run_dir, error, "TrainingError", exit_code)
    assert tracking.is_run_dir(run_dir)
    synced = tracking.sync_all([run_dir], client, stack="dev")[0]
    run = client.get_run(synced.run_id)
    assert run.info.status == status and run.info.end_time, run.info
    assert run.data.tags["trainstack.error"] == error
    assert run.data.tags["trainstack.launch"]
    assert history(client, synced.run_id, "val_loss") == [1, 2]


def test_a_failed_job_fails_its_run_with_the_error(tmp_path: Path, client: Any) -> None:
    error = "ValueError: shapes (None, 10) and (None, 3) are incompatible (model.py:12)"
    run_dir = make_run(tmp_path, "job-20261205-000004-dddd", done=1, state="failed", error=error)
    synced = sync_run(run_dir, client, stack="dev")
    run = client.get_run(synced.run_id)
    assert run.info.status == "FAILED" and run.info.end_time == 1_780_000_100_000
    assert run.data.tags["trainstack.error"] == error
    assert error in run.data.tags["mlflow.note.content"]
    assert {f.path for f in client.list_artifacts(synced.run_id)} == {"output.log"}


def test_a_cancelled_job_is_killed_and_the_manifest_names_the_experiment(
    tmp_path: Path, client: Any
) -> None:
    run_dir = make_run(tmp_path, "job-20261205-000005-eeee", done=2, state="cancelled",
                       error="cancelled while running", experiment="digits-sweep")  # fmt: skip
    synced = sync_run(run_dir, client, stack="dev")
    run = client.get_run(synced.run_id)
    assert run.info.status == "KILLED"
    assert client.get_experiment(run.info.experiment_id).name == "digits-sweep"


# -- a sweep: one parent run, its trials' runs its children (tracking.sweeps) -------------

DESCRIBE = {
    "method": "tpe", "metric": "val_accuracy", "goal": "max", "trials": "3", "parallel": "2",
    "early_stop": "median", "space.dropout": "uniform(0.0, 0.5)",
}  # fmt: skip


def write_sweep(root: Path, sweep_id: str, state: str,
                rows: list[tuple[int, str, float | None]], best: int | None) -> Path:  # fmt: skip
    """A sweep's directory as its driver leaves it: sweep.json and trials.json (`rows`: each
    trial's number, state and value)."""
    where = root / "sweeps" / sweep_id
    where.mkdir(parents=True, exist_ok=True)
    record = {
        "id": sweep_id, "state": state, "submitted_at": 1_779_999_990.0, "experiment": "",
        "stack": "dev", "job": "/home/u/digits", "definition": {"metric": "val_accuracy"},
        "describe": DESCRIBE, **({} if state == "running" else {"ended_at": 1_780_000_200.0}),
    }  # fmt: skip
    (where / "sweep.json").write_text(json.dumps(record))
    table = [
        {"number": n, "job_id": f"{sweep_id}-t{n:03d}", "params": {"dropout": n / 10},
         "state": trial_state, "value": value, "epochs": 2}
        for n, trial_state, value in rows
    ]  # fmt: skip
    chosen = next((row for row in table if row["number"] == best), None)
    (where / "trials.json").write_text(json.dumps({
        "metric": "val_accuracy", "goal": "max", "trials": table, "updated_at": time.time(),
        "best": chosen and {k: chosen[k] for k in ("number", "job_id", "value", "params")},
    }))  # fmt: skip
    return where


def make_trial(root: Path, sweep_id: str, number: int, state: str) -> Path:
    return make_run(root, f"{sweep_id}-t{number:03d}", epochs=2, done=2, state=state,
                    sweep=sweep_id, trial=number)  # fmt: skip


def test_a_sweep_is_one_parent_run_and_its_trials_its_children(
    server: Server, tmp_path: Path, client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep_id = "sweep-20261205-000001-abcd"
    rows: list[tuple[int, str, float | None]] = [(0, "succeeded", 0.7), (1, "running", None)]
    where = write_sweep(tmp_path, sweep_id, "running", rows, best=0)
    trial = [make_trial(tmp_path, sweep_id, n, state) for n, state, _ in rows]
    assert tracking.run_dirs(tmp_path) == trial  # the sweeps' directory is no run
    assert not any(s.error for s in tracking.sync_all(trial, client, stack="dev"))
    parent_id = json.loads((where / TRACKING_FILE).read_text())["run_id"]
    # Trial 1 pruned for lagging; trial 2 the best now.
    rows = [(0, "succeeded", 0.7), (1, "pruned", 0.5), (2, "succeeded", 0.9)]
    write_sweep(tmp_path, sweep_id, "running", rows, best=2)
    trial[1:] = [make_trial(tmp_path, sweep_id, n, state) for n, state, _ in rows[1:]]
    assert not any(s.error for s in tracking.sync_all(trial[1:], client, stack="dev"))
    assert client.get_run(parent_id).info.status == "RUNNING"  # the sweep still runs
    write_sweep(tmp_path, sweep_id, "succeeded", rows, best=2)
    # `sync` (as the daemon's round): the runs, up to date, then the sweep's pass.
    assert tracking.main(["sync", "--models-dir", str(tmp_path), "--tracking-uri", server.uri,
                          "--auth-file", str(server.auth_file), "--stack", "dev"]) == 0  # fmt: skip
    synced = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["synced"]
    assert [s["skipped"] for s in synced] == [True, True, True, False], synced
    ended = synced[-1]
    assert (ended["job_id"], ended["run_id"], ended["status"]) == (sweep_id, parent_id, "FINISHED")
    assert tracking.sync_sweeps(tmp_path, client, stack="dev")[0].skipped  # nothing new

    kind = "tags.`trainstack.kind` = 'sweep'"
    parents = client.search_runs(
        [e.experiment_id for e in client.search_experiments()],
        filter_string=f"tags.`trainstack.sweep` = '{sweep_id}' and {kind}",
    )  # fmt: skip
    assert [p.info.run_id for p in parents] == [parent_id]
    parent = parents[0]
    assert parent.info.run_name == sweep_id and parent.data.params == DESCRIBE
    assert parent.info.status == "FINISHED" and parent.info.end_time == 1_780_000_200_000
    assert parent.data.tags["trainstack.best_trial"] == f"{sweep_id}-t002"
    best = client.get_metric_history(parent_id, "best_val_accuracy")
    assert [(m.step, m.value) for m in best] == [(1, 0.7), (3, 0.9)]
    children = [the_run(client, f"{sweep_id}-t{n:03d}") for n in range(3)]
    for n, child in enumerate(children):
        tags = child.data.tags
        assert tags["mlflow.parentRunId"] == parent_id, tags
        assert (tags["trainstack.sweep"], tags["trainstack.trial"]) == (sweep_id, str(n))
        assert child.info.experiment_id == parent.info.experiment_id
    assert [c.info.status for c in children] == ["FINISHED", "KILLED", "FINISHED"]
    assert children[0].data.tags["trainstack.best"] == "false"
    assert children[2].data.tags["trainstack.best"] == "true"
    assert "trainstack.best" not in children[1].data.tags


def test_a_trial_whose_sweep_is_missing_is_a_plain_run(tmp_path: Path, client: Any) -> None:
    run_dir = make_trial(tmp_path, "sweep-20261205-000009-ffff", 0, "succeeded")
    synced = sync_run(run_dir, client, stack="dev")
    assert synced.complete and not synced.error
    tags = client.get_run(synced.run_id).data.tags
    assert "mlflow.parentRunId" not in tags and "trainstack.sweep" not in tags


def test_two_syncs_racing_to_make_the_parent_leave_one(
    tmp_path: Path, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two syncs on two nodes (the sweep's lock holds on one): each makes a parent; the one
    that wrote tracking.json first is the sweep's, the other deletes its own."""
    from mlflow.entities import ViewType

    sweep_id = "sweep-20261205-000002-bcde"
    where = write_sweep(tmp_path, sweep_id, "running", [], best=None)
    create_run, first = client.create_run, []

    def racing(*args: Any, **kwargs: Any) -> Any:
        if not first:  # the other sync makes and writes its parent meanwhile
            first.append("")
            first[0] = make_parent(client, SweepFiles.read(where), "dev")
        return create_run(*args, **kwargs)

    monkeypatch.setattr(client, "create_run", racing)
    mine = make_parent(client, SweepFiles.read(where), "dev")
    assert mine == first[0] == json.loads((where / TRACKING_FILE).read_text())["run_id"]
    made = client.search_runs(
        [client.get_experiment_by_name("dev").experiment_id],
        filter_string=f"tags.`trainstack.sweep` = '{sweep_id}'", run_view_type=ViewType.ALL,
    )  # fmt: skip
    assert sorted(r.info.lifecycle_stage for r in made) == ["active", "deleted"]
    assert next(r for r in made if r.info.lifecycle_stage == "active").info.run_id == mine


def test_server_down_loses_nothing(server: Server, tmp_path: Path, client: Any, sent: Sent) -> None:
    run_dir = make_run(tmp_path, "job-20261205-000006-ffff", state="succeeded")
    server.stop()
    try:
        started = time.monotonic()
        done = tracking.main(["sync", "--models-dir", str(tmp_path), "--tracking-uri",
                              server.uri, "--auth-file", str(server.auth_file)])  # fmt: skip
        assert done == 1 and time.monotonic() - started < 15
        assert not (run_dir / TRACKING_FILE).exists()
    finally:
        server.start()
    synced = sync_run(run_dir, client, stack="dev")
    assert history(client, synced.run_id, "loss") == [1, 2, 3, 4, 5]
    sent.each_once(synced.run_id, range(1, 6))


def test_sync_prints_one_json_line(
    server: Server, tmp_path: Path, client: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    make_run(tmp_path, "job-20261205-000007-abab", state="succeeded")
    code = tracking.main(["sync", "--models-dir", str(tmp_path), "--tracking-uri", server.uri,
                          "--auth-file", str(server.auth_file), "--job",
                          "job-20261205-000007-abab"])  # fmt: skip
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0 and len(out) == 1
    (only,) = json.loads(out[0])["synced"]
    assert only["job_id"] == "job-20261205-000007-abab" and only["complete"] and only["run_id"]


def test_watch_picks_up_a_new_run_dir(tmp_path: Path, client: Any, sent: Sent) -> None:
    """The daemon's rounds (every 0.2 s here) send each epoch once, however many there are."""
    stop = threading.Event()
    loop = threading.Thread(
        target=tracking.watch, args=(tmp_path, client, 0.2), kwargs={"stop": stop}
    )
    loop.start()
    try:
        time.sleep(0.5)
        run_dir = make_run(tmp_path, "job-20261205-000008-cdcd", state="succeeded")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not tracking.up_to_date(run_dir):
            time.sleep(0.2)
        assert tracking.up_to_date(run_dir)
    finally:
        stop.set()
        loop.join(30)
    run_id = the_run(client, "job-20261205-000008-cdcd").info.run_id
    assert history(client, run_id, "loss") == [1, 2, 3, 4, 5]
    sent.each_once(run_id, range(1, 6))


def test_watch_ends_on_sigterm(server: Server, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainstack_training.tracking", "watch", "--models-dir",
         str(tmp_path), "--tracking-uri", server.uri, "--auth-file", str(server.auth_file)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert proc.stderr is not None and b"Traceback" not in proc.stderr.read()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["sync", "--tracking-uri", "localhost:5000"], "--tracking-uri"),
        (["sync", "--tracking-uri", "http://x:1", "--auth-file", "/nonexistent"], "--auth-file"),
        (["sync", "--tracking-uri", "http://x:1", "--job", "job-none"], "--job"),
        (["watch", "--tracking-uri", "http://x:1", "--interval", "0"], "--interval"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tracking.main([*argv, "--models-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and err[0].startswith("tracking: error:")


def test_the_training_package_imports_without_mlflow() -> None:
    code = (
        "import sys; sys.modules['mlflow'] = None\n"
        "import trainstack_training.tracking, trainstack_training.queue.process\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
